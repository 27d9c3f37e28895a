{{ config(location=export_location('hub_accounts')) }}

with

hub_accounts as (

    select * from {{ ref('hub_accounts') }}

)

select
    user_id,
    in_degree
from hub_accounts
order by user_id
