{{ config(location=export_location('popularity_index')) }}

with

popularity_index as (

    select * from {{ ref('popularity_index') }}

)

select
    tag,
    candidate_id,
    popularity_rank,
    in_degree
from popularity_index
order by tag, popularity_rank
