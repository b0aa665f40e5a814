"""mkdocs hooks: the configuration reference, and the repository's examples and cluster files.

The configuration reference is generated from ``gpuzarr_dist/gpuzarr.yaml``.

The defaults file is the one place every ``gpuzarr.*`` setting is declared: a flat
mapping from the full key to ``default``, ``description`` (one line, required),
and optionally ``choices`` and ``details`` (markdown). ``docs/configuration.md``
holds the page's introduction and the marker line ``<!-- gpuzarr-config -->``;
this hook replaces the marker with a table of every key and a section per key
that has details. A key without a description, or a file that is not such a
mapping, stops the build with an error naming the key.

The folders ``examples/`` and ``cluster/`` live at the repository's root, beside
the package, where users look for them; the build adds their files to the site
under the same paths (``examples/README.md`` becomes a page, scripts and YAML
files are copied), so the docs link to them and the links are checked.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

MARKER = "<!-- gpuzarr-config -->"
PAGE = "configuration.md"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = os.path.join(ROOT, "gpuzarr_dist", "gpuzarr.yaml")
_FIELDS = {"default", "choices", "description", "details"}
#: repository folders whose files the site carries under the same paths
SHARED_FOLDERS = ("examples", "cluster")


class ConfigDocError(ValueError):
    """The defaults file cannot be turned into the configuration reference."""


def load_defaults(path: str = DEFAULTS) -> dict[str, dict[str, Any]]:
    """Read and check the defaults file; return ``{key: entry}`` in file order."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not data:
        raise ConfigDocError(f"{path}: expected a mapping of gpuzarr.* keys, got {type(data).__name__}")
    for key, entry in data.items():
        if not isinstance(key, str) or not key.startswith("gpuzarr."):
            raise ConfigDocError(f"{path}: key {key!r} does not start with 'gpuzarr.'")
        if not isinstance(entry, dict):
            raise ConfigDocError(f"{path}: {key}: expected a mapping with default and description, got {entry!r}")
        unknown = set(entry) - _FIELDS
        if unknown:
            raise ConfigDocError(f"{path}: {key}: unknown fields {sorted(unknown)} (allowed: {sorted(_FIELDS)})")
        if "default" not in entry:
            raise ConfigDocError(f"{path}: {key}: no default")
        description = entry.get("description")
        if not isinstance(description, str) or not description.strip():
            raise ConfigDocError(f"{path}: {key}: no description (every setting needs a one-line description)")
        if "choices" in entry and not isinstance(entry["choices"], list):
            raise ConfigDocError(f"{path}: {key}: choices must be a list, got {entry['choices']!r}")
        if "details" in entry and not isinstance(entry["details"], str):
            raise ConfigDocError(f"{path}: {key}: details must be markdown text, got {entry['details']!r}")
    return data


def _value(v: Any) -> str:
    """A default or choice as the YAML file spells it (``null``, ``true``), in code style."""
    if v is None:
        text = "null"
    elif isinstance(v, bool):
        text = "true" if v else "false"
    else:
        text = str(v)
    return f"`{text}`" if text else '`""`'


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def anchor(key: str) -> str:
    """The heading id of a key's section: ``gpuzarr.gpu.nvcomp-api`` -> ``gpuzarr-gpu-nvcomp-api``."""
    return re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")


def render(data: dict[str, dict[str, Any]]) -> str:
    """The markdown of the reference: one table of every key, then a section per key with details."""
    lines = ["| key | default | choices | description |", "|---|---|---|---|"]
    for key, entry in data.items():
        name = f"[`{key}`](#{anchor(key)})" if entry.get("details") else f"`{key}`"
        choices = ", ".join(_value(c) for c in entry.get("choices") or ())
        lines.append(f"| {name} | {_value(entry['default'])} | {choices} | {_cell(entry['description'])} |")
    detailed = [(k, e) for k, e in data.items() if e.get("details")]
    if detailed:
        lines += ["", "## Details"]
        for key, entry in detailed:
            lines += ["", f"### `{key}` {{ #{anchor(key)} }}", "", entry["details"].strip()]
    return "\n".join(lines) + "\n"


_LINK = re.compile(r"(\]\()([^)\s#]+)")


def site_links(markdown: str, src_uri: str) -> str:
    """Links of a page from ``examples/`` or ``cluster/`` into ``docs/``, rewritten for the site.

    In the repository ``examples/README.md`` links ``../docs/reading.md``; in the
    site ``docs/`` is the root, so the same page links ``../reading.md``.
    """
    here = posixpath.dirname(src_uri)

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        resolved = posixpath.normpath(posixpath.join(here, target))
        if not resolved.startswith("docs/"):
            return m.group(0)
        return m.group(1) + posixpath.relpath(resolved[len("docs/"):], here or ".")

    return _LINK.sub(fix, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri.startswith(tuple(f + "/" for f in SHARED_FOLDERS)):
        return site_links(markdown, page.file.src_uri)
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ConfigDocError(f"docs/{PAGE} lost its marker line {MARKER}")
    return markdown.replace(MARKER, render(load_defaults()))


def on_serve(server, config, builder):
    server.watch(DEFAULTS)
    for folder in SHARED_FOLDERS:
        server.watch(os.path.join(ROOT, folder))
    return server


def on_files(files: Files, config) -> Files:
    for folder in SHARED_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            for name in sorted(filenames):
                if name.startswith(".") or name.endswith(".pyc"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
                files.append(File(rel, ROOT, config["site_dir"], config["use_directory_urls"]))
    return files
