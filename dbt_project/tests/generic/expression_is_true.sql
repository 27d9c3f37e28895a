{#-
    Every row satisfies a boolean SQL expression. On a column, the expression is appended to the
    column name (expression: ">= 0"); on a model, it is used as is. Fails with the offending rows;
    a NULL result counts as a failure.
-#}
{% test expression_is_true(model, expression, column_name=none) %}

with

checked as (
    select
        *,
        {% if column_name is none %}({{ expression }}){% else %}({{ column_name }} {{ expression }}){% endif %} as passes
    from {{ model }}
)

select * from checked
where passes is not true

{% endtest %}
