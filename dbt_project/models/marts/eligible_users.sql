{#-
    Eligibility rule (design document: "users who were active in the last 30 days"): an account
    is refreshed tonight when its status is active and its last activity is no earlier than
    as_of minus var eligibility_window_days. as_of is midnight UTC after the snapshot date, so a
    30-day window covers the snapshot date and the 29 days before it. Never-active accounts
    (last_active_at null) are not eligible.
-#}
with

users as (

    select * from {{ ref('stg_users') }}

),

eligible as (

    select
        user_id,
        {{ shard_id('user_id') }} as shard_id
    from users
    where
        account_status = 'active'
        and last_active_at >= {{ as_of() }} - to_days({{ var('eligibility_window_days') }})

)

select * from eligible
order by user_id
