with

source as (

    select * from {{ source('snapshot', 'user_interests') }}

),

renamed as (

    select
        cast(user_id as bigint) as user_id,
        cast(tag as varchar) as tag
    from source
    -- a blank tag carries no interest, and the global list's tag is reserved
    where
        tag is not null
        and trim(tag) <> ''
        and tag <> {{ global_tag() }}

)

select * from renamed
