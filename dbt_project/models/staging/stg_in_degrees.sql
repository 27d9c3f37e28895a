with

source as (

    select * from {{ source('snapshot', 'in_degrees') }}

),

renamed as (

    select
        cast(user_id as bigint) as user_id,
        cast(in_degree as bigint) as in_degree
    from source

)

select * from renamed
