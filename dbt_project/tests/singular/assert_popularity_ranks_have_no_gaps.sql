{#- Within each tag, popularity_rank is exactly 1..N. Fails with the tags where it is not. -#}
with

popularity_index as (

    select * from {{ ref('popularity_index') }}

),

per_tag as (

    select
        tag,
        count(*) as ranked_accounts,
        min(popularity_rank) as first_rank,
        max(popularity_rank) as last_rank
    from popularity_index
    group by tag

)

select * from per_tag
where first_rank <> 1 or last_rank <> ranked_accounts
