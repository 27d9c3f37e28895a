{#-
    Cold-start popularity index (design document, "Cold-Start Fallback Ranking"): for each
    interest tag, the var popularity_per_tag most-followed recommendable accounts that carry the
    tag, plus the tag '_global' ranking all recommendable accounts. Ties on in_degree go to the
    smaller candidate_id, so the ranking is deterministic. An account nobody follows (in_degree
    0) is not popular: it is in no list (accounts an interests import alone had made were
    offered to new users as filler). The read API falls back to the live store's accounts past
    the index's end.
-#}
with

candidates as (

    select * from {{ ref('candidate_profiles') }}

),

interests as (

    select * from {{ ref('stg_user_interests') }}

),

recommendable as (

    select
        candidate_id,
        in_degree
    from candidates
    where is_recommendable and in_degree > 0

),

tagged as (

    select
        interests.tag,
        recommendable.candidate_id,
        recommendable.in_degree
    from recommendable
    inner join interests
        on recommendable.candidate_id = interests.user_id

),

global_list as (

    select
        {{ global_tag() }} as tag,
        candidate_id,
        in_degree
    from recommendable

),

pooled as (

    select * from tagged
    union all
    select * from global_list

),

ranked as (

    select
        tag,
        candidate_id,
        row_number() over (
            partition by tag
            order by in_degree desc, candidate_id asc
        ) as popularity_rank,
        in_degree
    from pooled

)

select * from ranked
where popularity_rank <= {{ var('popularity_per_tag') }}
order by tag, popularity_rank
