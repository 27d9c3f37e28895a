with

source as (

    select * from {{ source('snapshot', 'blocks') }}

),

renamed as (

    select
        cast(blocker_id as bigint) as blocker_id,
        cast(blocked_id as bigint) as blocked_id,
        cast(created_at as timestamp) as blocked_at
    from source

)

select * from renamed
