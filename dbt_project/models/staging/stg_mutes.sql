with

source as (

    select * from {{ source('snapshot', 'mutes') }}

),

renamed as (

    select
        cast(muter_id as bigint) as muter_id,
        cast(muted_id as bigint) as muted_id,
        cast(created_at as timestamp) as muted_at
    from source

)

select * from renamed
