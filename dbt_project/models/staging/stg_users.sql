with

source as (

    select * from {{ source('snapshot', 'users') }}

),

renamed as (

    select
        cast(user_id as bigint) as user_id,
        cast(created_at as timestamp) as created_at,
        cast(last_active_at as timestamp) as last_active_at,
        cast(account_status as varchar) as account_status,
        cast(is_discoverable as boolean) as is_discoverable,
        cast(is_private as boolean) as is_private
    from source

)

select * from renamed
