{#-
    The model has at most one row per combination of the given columns (a compound key).
    Fails with one row per duplicated key. Written here because dbt packages (dbt_utils) are not
    installed in this project.
-#}
{% test unique_combination_of_columns(model, combination_of_columns) %}

with

keyed as (
    select
        {{ combination_of_columns | join(', ') }},
        count(*) as row_count
    from {{ model }}
    group by {{ combination_of_columns | join(', ') }}
)

select * from keyed
where row_count > 1

{% endtest %}
