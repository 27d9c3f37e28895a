{#-
    Run-scoped values (--vars) as SQL literals. At parse time (execute is false) a missing value
    renders a placeholder so `dbt parse --vars '{run_dir: ...}'` works; at run time it is an error.
-#}

{#- The run's snapshot date as a 'YYYY-MM-DD' string: var snapshot_date, else the <snapshot_date>
    segment of run_dir (runs/<snapshot_date>/<run_id>, recs.nightly.runs), else an error. -#}
{%- macro snapshot_date_value() -%}
    {%- set given = var('snapshot_date', none) -%}
    {%- if given is not none -%}
        {{- return(given | string) -}}
    {%- endif -%}
    {%- set segments = (var('run_dir') | string).rstrip('/').split('/') -%}
    {%- set parent = segments[-2] if segments | length > 1 else '' -%}
    {%- if modules.re.fullmatch('[0-9]{4}-[0-9]{2}-[0-9]{2}', parent) -%}
        {{- return(parent) -}}
    {%- endif -%}
    {%- if execute -%}
        {{- exceptions.raise_compiler_error(
            "var snapshot_date is not set and run_dir " ~ var('run_dir')
            ~ " is not runs/<YYYY-MM-DD>/<run_id>: pass --vars '{snapshot_date: YYYY-MM-DD}'"
        ) -}}
    {%- endif -%}
    {{- return('1970-01-01') -}}
{%- endmacro -%}

{#- The run's reference instant (recs.nightly.runs.RunPaths.as_of): var as_of, else midnight UTC
    at the start of the day after the snapshot date. Naive UTC TIMESTAMP literal. -#}
{%- macro as_of() -%}
    {%- set given = var('as_of', none) -%}
    {%- if given is not none -%}
        cast('{{ given }}' as timestamp)
    {%- else -%}
        (cast('{{ snapshot_date_value() }}' as date) + interval 1 day)::timestamp
    {%- endif -%}
{%- endmacro -%}

{#- The tag of the tag-agnostic popularity list (recs.contracts.GLOBAL_TAG). -#}
{%- macro global_tag() -%}'_global'{%- endmacro -%}

{#- Where the export of `name` is written: <run_dir>/exports/<name>[.parquet]
    (recs.nightly.runs). -#}
{%- macro export_location(name, partitioned=false) -%}
    {%- set suffix = '' if partitioned else '.parquet' -%}
    {{- var('run_dir') | string | replace('\\', '/') }}/exports/{{ name }}{{ suffix -}}
{%- endmacro -%}
