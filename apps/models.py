"""`aie-apps models`: the known model names, which are here and from where, and how to get the others;
`aie-apps models pull NAME` downloads one into the Hugging Face cache."""
from __future__ import annotations

from typing import Annotated

import typer

from sdk import hub

from .cli import JsonOpt, app, command, err, out_json

models_app = typer.Typer(no_args_is_help=False, invoke_without_command=True, rich_markup_mode=None,
                         help="List the known models (installed or not, and how to get them); pull one.")
app.add_typer(models_app, name="models")


@models_app.callback()
@command
def models(ctx: typer.Context, json: JsonOpt = False):
    """List the known models: where each installed one is, and the command that gets each missing one."""
    if ctx.invoked_subcommand is not None:
        return
    rows = []
    for name, known in hub.KNOWN.items():
        src = hub.find_installed(name)
        rows.append({"name": name, "repo": known.hf_repo, "installed": src is not None,
                     "origin": src.origin if src else None, "path": str(src.path) if src else None,
                     "get": None if src else hub.how_to_get(name)})
    if json:
        out_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        where = f"{r['origin']:9} {r['path']}" if r["installed"] else f"missing   get it: {r['get']}"
        print(f"{r['name']:{width}}  {where}")


@models_app.command("pull")
@command
def pull(name: Annotated[str, typer.Argument(help="a known name (see `aie-apps models`) or a Hugging Face repo id")],
         json: JsonOpt = False):
    """Download a model into the Hugging Face cache (resumable; every file checked against the server's hash)."""
    src = hub.pull(name)
    if json:
        out_json({"name": src.name, "origin": src.origin, "path": str(src.path)})
    else:
        err(f"{src.name}: {src.origin}")
        print(src.path)
