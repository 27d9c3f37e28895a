{{ config(location=export_location('candidate_profiles')) }}

with

candidate_profiles as (

    select * from {{ ref('candidate_profiles') }}

)

select
    candidate_id,
    account_status,
    last_active_at,
    is_discoverable,
    in_degree,
    is_recommendable
from candidate_profiles
order by candidate_id
