"""``sr-controlplane``: serve the API, migrate the catalog, import a catalog file."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web

from controlplane.app import create_app
from controlplane.catalog import SAMPLE_CATALOG, CatalogError, import_catalog_file
from controlplane.config import Settings, SettingsError
from controlplane.db import make_engine, migrate
from controlplane.telemetry import configure_logging


async def _migrate(settings: Settings) -> str:
    engine = make_engine(settings.database_url)
    try:
        return await migrate(engine)
    finally:
        await engine.dispose()


async def _import(settings: Settings, path: str) -> dict[str, int]:
    engine = make_engine(settings.database_url)
    try:
        await migrate(engine)
        return await import_catalog_file(engine, path)
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Entry point; configuration comes from ``SR_CP_*`` environment variables (see docs/controlplane.md)."""
    parser = argparse.ArgumentParser(prog="sr-controlplane")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the deployments API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8090)
    Settings.add_arguments(serve)
    sub.add_parser("migrate", help="create or upgrade the catalog schema")
    cat = sub.add_parser("catalog", help="catalog maintenance")
    cat_sub = cat.add_subparsers(dest="catalog_cmd", required=True)
    imp = cat_sub.add_parser("import", help="load engines, models and artifacts from a YAML file")
    imp.add_argument("file", nargs="?", default=str(SAMPLE_CATALOG))
    args = parser.parse_args(argv)

    try:
        settings = Settings.resolve(args if args.cmd == "serve" else None)
    except SettingsError as exc:
        print(f"sr-controlplane: invalid setting {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    if args.cmd == "serve":
        web.run_app(create_app(settings), host=args.host, port=args.port, print=None,
                    shutdown_timeout=settings.shutdown_timeout_s)
        return 0
    if args.cmd == "migrate":
        print(f"schema revision {asyncio.run(_migrate(settings))}")
        return 0
    try:
        counts = asyncio.run(_import(settings, args.file))
    except (CatalogError, OSError) as exc:
        print(f"sr-controlplane: {exc}", file=sys.stderr)
        return 2
    json.dump(counts, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
