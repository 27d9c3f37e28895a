{#- The cold-start lists hold only active, discoverable accounts. Fails with any other. -#}
with

popularity_index as (

    select * from {{ ref('popularity_index') }}

),

candidate_profiles as (

    select * from {{ ref('candidate_profiles') }}

)

select
    popularity_index.tag,
    popularity_index.candidate_id
from popularity_index
left join candidate_profiles
    on popularity_index.candidate_id = candidate_profiles.candidate_id
where candidate_profiles.is_recommendable is not true
