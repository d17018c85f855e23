"""mkdocs hook that builds the generated half of the documentation site, offline, at every build.

Written files would go stale the day an option changes, so nothing here is committed: the CLI reference
is rendered from the argparse parsers (`app.cli.parser.build_parser`), the REST reference from the
FastAPI app's OpenAPI schema (the app is created, never started: no model loads, no socket opens), and
one Python reference page per module is a `::: module` stub that mkdocstrings fills from the docstrings.
README, RESULTS and BENCHMARKS live at the repository root, where GitHub shows them; the hook copies them
into the site and rewrites every relative link so that it resolves in both places.
"""
from __future__ import annotations

import json
import os
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("training", "indexer", "search", "app", "ui")
ROOT_PAGES = {"README.md": "index.md", "RESULTS.md": "RESULTS.md", "BENCHMARKS.md": "BENCHMARKS.md"}
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")

if str(ROOT) not in sys.path:  # document this checkout, not an installed copy
    sys.path.insert(0, str(ROOT))


# ---- links --------------------------------------------------------------------------------------------
def _site_path(repo_path: str) -> str | None:
    """Where a repository file is in the site, or None when the site does not carry it (source files)."""
    if repo_path in ROOT_PAGES:
        return ROOT_PAGES[repo_path]
    if repo_path.startswith("docs/"):
        target = ROOT / repo_path
        if target.is_dir():  # a folder of results: its table, when it has one
            return repo_path[5:].rstrip("/") + "/results.md" if (target / "results.md").is_file() else None
        return repo_path[5:]  # a file that does not exist stays a link: the strict build reports it
    return None


def site_links(markdown: str, repo_dir: str, site_dir: str) -> str:
    """Rewrite the relative links of a page that lives in ``repo_dir`` of the repository and at
    ``site_dir`` of the site; a link to something the site does not carry keeps its text only."""
    def fix(m: re.Match) -> str:
        bang, text, target = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        site = _site_path(posixpath.normpath(posixpath.join(repo_dir, path)))
        if site is None:
            return text
        rel = posixpath.relpath(site, site_dir or ".")
        return f"{bang}[{text}]({rel}{'#' + anchor if anchor else ''})"
    return _LINK.sub(fix, markdown)


# ---- the CLI reference ------------------------------------------------------------------------------------
def _parsers(parser, name: str):
    """Every parser under ``parser`` (sub-subcommands such as `ltd data info` included), depth first."""
    yield name, parser
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def cli_reference() -> str:
    from app.cli.parser import build_parser

    os.environ["COLUMNS"] = "110"  # argparse wraps to the terminal: a fixed width, the same page everywhere
    top, _ = build_parser()
    out = ["# CLI reference", "",
           "Generated from the argparse parsers (`app/cli/`) at every site build: `ltd COMMAND --help` prints "
           "the same text.", ""]
    for name, parser in _parsers(top, "ltd"):
        out += [f"## `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ---- the REST reference -----------------------------------------------------------------------------------
def openapi_schema() -> dict:
    from app.api.main import create_app
    from app.api.settings import Settings

    return create_app(Settings(models={"bl": "-", "ltd": "-"}, ui=False)).openapi()


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _type(schema: dict) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def _operation(path: str, method: str, op: dict) -> list[str]:
    out = [f"### `{method.upper()} {path}`", "", op.get("summary", ""), "", op.get("description", "").strip(), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        out += [f"| `{p['name']}` | {p['in']} | {_cell(_type(p.get('schema', {})))} | {p.get('required', False)} "
                f"| {_cell(p.get('description'))} |" for p in params]
        out.append("")
    body = op.get("requestBody", {}).get("content", {})
    if body:
        out += ["Request body: " + "; ".join(f"`{ct}` ({_cell(_type(c.get('schema', {})))})" for ct, c in body.items()),
                ""]
    out += ["| status | description |", "|---|---|"]
    out += [f"| {code} | {_cell(r.get('description'))} |" for code, r in op.get("responses", {}).items()]
    return out + [""]


def rest_reference(schema: dict) -> str:
    info = schema.get("info", {})
    out = ["# REST API reference", "",
           f"{info.get('title', '')} {info.get('version', '')}. Generated from the app's OpenAPI schema at every "
           "site build ([openapi.json](openapi.json)); a running server serves the same schema at `/openapi.json` "
           "and an interactive page at `/docs`.", ""]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            out += _operation(path, method, op)
    out += ["## Schemas", ""]
    for name, s in schema.get("components", {}).get("schemas", {}).items():
        out += [f"### {name}", "", _cell(s.get("description")), ""]
        props, required = s.get("properties", {}), set(s.get("required", []))
        if props:
            out += ["| field | type | required | description |", "|---|---|---|---|"]
            out += [f"| `{k}` | {_cell(_type(v))} | {k in required} | {_cell(v.get('description'))} |"
                    for k, v in props.items()]
            out.append("")
    return "\n".join(out)


# ---- the Python reference ---------------------------------------------------------------------------------
def modules() -> list[str]:
    """Every module of the library packages, in file order (``__main__`` entry points left out)."""
    names = []
    for top in PACKAGES:
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def python_reference() -> dict[str, str]:
    pages = {}
    index = ["# Python reference", "",
             "One page per module, rendered from its docstrings. Imports flow one way, "
             "`training ← indexer ← search ← app`, and `ui` sees only the service.", ""]
    for name in modules():
        uri = f"reference/python/{name}.md"
        pages[uri] = f"# `{name}`\n\n::: {name}\n"
        depth = name.count(".")
        index.append(f"{'    ' * depth}- [`{name}`]({name}.md)")
    pages["reference/python/index.md"] = "\n".join(index) + "\n"
    return pages


# ---- mkdocs events ----------------------------------------------------------------------------------------
def on_files(files: Files, config) -> Files:
    generated = {site: site_links((ROOT / repo).read_text(), "", "") for repo, site in ROOT_PAGES.items()}
    schema = openapi_schema()
    generated["reference/cli.md"] = cli_reference()
    generated["reference/rest.md"] = rest_reference(schema)
    generated["reference/openapi.json"] = json.dumps(schema, indent=1)
    generated.update(python_reference())
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    uri = page.file.src_uri
    if page.file.generated_by is not None:  # rewritten when generated
        return markdown
    return site_links(markdown, posixpath.dirname("docs/" + uri), posixpath.dirname(uri))
