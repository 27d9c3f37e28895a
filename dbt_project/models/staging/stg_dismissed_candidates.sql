with

source as (

    select * from {{ source('snapshot', 'dismissed_candidates') }}

),

renamed as (

    select
        cast(user_id as bigint) as user_id,
        cast(candidate_id as bigint) as candidate_id,
        cast(dismissed_at as timestamp) as dismissed_at
    from source

)

select * from renamed
