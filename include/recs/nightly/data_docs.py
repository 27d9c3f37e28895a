"""GX Data Docs that work where no CDN is reachable: their scripts and stylesheets served locally.

GX's page templates load jQuery, Popper, Bootstrap, bootstrap-table and bootstrap-datepicker
from public CDNs, and the index's table of validation results is drawn by bootstrap-table:
offline (an Airflow UI behind a firewall, CI) the index lists no validation at all. After the
gate builds a site (``checkpoints.build_data_docs``), ``use_local_assets`` copies the files of
``data_docs_vendor/`` into the site's ``static/vendor/`` and points every page at them (a
relative path per page). They are the very files the CDN URLs name, from the packages' npm
tarballs: the Subresource Integrity hashes GX's templates carry match them, so those attributes
stay. Font Awesome's stylesheet and fonts are replaced by ``icons.css``, the five icons GX uses as
characters (✔ met, ✖ failed, ...). Tags of what our pages do not use are removed: Vega (no
suite of ours renders a chart) and the dark theme. Sources and licences:
``data_docs_vendor/README.md``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

VENDOR_DIR = Path(__file__).with_name("data_docs_vendor")

LOCAL_COPIES = {
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.min.js",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js":
        "bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css":
        "bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.js": "bootstrap-table-filter-control.min.js",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.css": "bootstrap-table-filter-control.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.css": "bootstrap-table-filter-control.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/"
    "bootstrap-datepicker.min.js": "bootstrap-datepicker.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/"
    "bootstrap-datepicker.min.css": "bootstrap-datepicker.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "icons.css",
}
"""CDN URL in GX's templates -> the same file in ``data_docs_vendor/``."""

DROPPED = (
    "https://cdn.jsdelivr.net/npm/vega",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark",
)
"""URL prefixes whose ``<script>``/``<link>`` tags are removed (module docstring)."""

_TAG = re.compile(
    r"<script\b[^>]*\bsrc=\"(?P<script>https?://[^\"]+)\"[^>]*>\s*</script>"
    r"|<link\b[^>]*\bhref=\"(?P<link>https?://[^\"]+)\"[^>]*>",
    re.IGNORECASE,
)


def use_local_assets(site: Path) -> int:
    """Copy the vendored files into ``site/static/vendor/`` and rewrite every page of the site
    (``*.html``) to load them; returns the number of tags rewritten or removed. A CDN URL this
    module does not know is left as it is (GX may add one): a test lists the remote tags left."""
    vendor = site / "static" / "vendor"
    vendor.mkdir(parents=True, exist_ok=True)
    for name in set(LOCAL_COPIES.values()):
        shutil.copyfile(VENDOR_DIR / name, vendor / name)
    changed = 0
    for page in site.rglob("*.html"):
        prefix = Path(os.path.relpath(vendor, page.parent)).as_posix()

        def local(match: re.Match, prefix: str = prefix) -> str:
            nonlocal changed
            url = match["script"] or match["link"]
            if url.startswith(DROPPED):
                changed += 1
                return ""
            if url in LOCAL_COPIES:
                changed += 1
                return match[0].replace(url, f"{prefix}/{LOCAL_COPIES[url]}")
            return match[0]

        text = page.read_text(encoding="utf-8")
        page.write_text(_TAG.sub(local, text), encoding="utf-8")
    return changed


def remote_assets(site: Path) -> list[str]:
    """The remote URLs still loaded as scripts or stylesheets by any page of ``site``."""
    return sorted(
        {
            match["script"] or match["link"]
            for page in site.rglob("*.html")
            for match in _TAG.finditer(page.read_text(encoding="utf-8"))
        }
    )
