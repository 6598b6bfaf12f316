"""``mqguard docs``: regenerate or check the generated reference pages."""

from __future__ import annotations

import click

from mqguard import docsgen


@click.group()
def docs() -> None:
    """The reference pages generated from the code (configuration, hooks)."""


@docs.command("generate")
@click.option("--docs-dir", default="docs", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory the pages are written to (the repository's docs/).")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 naming every page that is missing or out of date.")
def generate(docs_dir: str, check: bool) -> None:
    """Write docs/configuration.md (from the settings models) and docs/hooks.md (from the
    hookspecs); with --check, only tell whether they are current."""
    if check:
        stale = docsgen.stale_pages(docs_dir)
        if stale:
            names = ", ".join(str(p) for p in stale)
            raise click.ClickException(f"out of date: {names}; run `mqguard docs generate`")
        click.echo(f"{len(docsgen.PAGES)} generated page(s) up to date in {docs_dir}")
        return
    written = docsgen.write_pages(docs_dir)
    for path in written:
        click.echo(f"wrote {path}")
    if not written:
        click.echo(f"{len(docsgen.PAGES)} generated page(s) already up to date in {docs_dir}")
