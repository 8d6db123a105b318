"""The web UI: static files (HTML, ES modules, CSS, the vendored chart library) served under /ui by the API process.

The pages call the same endpoints as any client, with the API key the user typed (kept in sessionStorage, sent
as `X-API-Key`), so they can show nothing a key could not read. No build step, no CDN: everything the browser
loads comes from `query_api/ui/` (package data).

The files (about 150 KB) are read once, at import, and served from memory: each answer is a dictionary lookup
(StaticFiles' stat and read on the thread pool, one file after the other, cost a cold counter page more than half
its load time). index.html is rewritten once so that every file it loads, and every module any module imports
(through an import map), has its content hash in its URL (`js/api.js?v=3f2a...`): those URLs are cached as
immutable, so a repeat visit loads no file but index.html, which is revalidated (ETag, `no-cache`) and therefore
never stale after an upgrade. Edits to the files need an API restart.

Every response carries a Content-Security-Policy allowing only this origin's scripts and styles (and the import
map, by its hash), so a counter name or a dead letter's record can never run as script.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
CSP = ("default-src 'self'; script-src 'self' {import_map}; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
SECURITY = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
REVALIDATE = "no-cache"
IMMUTABLE = "public, max-age=31536000, immutable"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".md": "text/plain; charset=utf-8", "": "text/plain; charset=utf-8"}
URL_PREFIX = "/ui/"


@dataclass(frozen=True, slots=True)
class UiFile:
    body: bytes
    media_type: str
    etag: str

    @property
    def version(self) -> str:
        return self.etag.strip('"')[:12]


def _file(body: bytes, media_type: str) -> UiFile:
    return UiFile(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:24]}"')


def load_files(directory: Path = UI_DIR) -> dict[str, UiFile]:
    """Every file under `directory` by its path relative to it ("js/app.js"); index.html with versioned URLs."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            media_type = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            files[path.relative_to(directory).as_posix()] = _file(path.read_bytes(), media_type)
    if "index.html" in files:
        files["index.html"] = _file(versioned_index(files["index.html"].body.decode(), files).encode(),
                                    TYPES[".html"])
    return files


def versioned_index(html: str, files: dict[str, UiFile]) -> str:
    """index.html loading every file by a URL holding its version, and an import map sending every module's
    imports to the versioned URLs too (imports resolve to /ui/js/x.js; the map redirects them)."""
    html = re.sub(r'(href|src)="([^":#?]+)"',
                  lambda m: f'{m[1]}="{m[2]}?v={files[m[2]].version}"' if m[2] in files else m[0], html)
    modules = {f"{URL_PREFIX}{name}": f"{URL_PREFIX}{name}?v={f.version}" for name, f in files.items()
               if name.endswith(".js") and name.startswith("js/")}
    import_map = json.dumps({"imports": modules}, indent=1)
    return html.replace("<!-- import map -->", f'<script type="importmap">{import_map}</script>')


def _import_map_hash(index: bytes) -> str:
    found = re.search(rb'<script type="importmap">(.*?)</script>', index, re.S)
    if found is None:
        return ""
    return f"'sha256-{base64.b64encode(hashlib.sha256(found[1]).digest()).decode()}'"


FILES = load_files()
HEADERS = {**SECURITY, "Content-Security-Policy": CSP.format(
    import_map=_import_map_hash(FILES["index.html"].body) if "index.html" in FILES else "")}

router = APIRouter(include_in_schema=False)


@router.api_route("/", methods=["GET", "HEAD"])
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.api_route("/ui", methods=["GET", "HEAD"])
async def ui_slash() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.api_route("/ui/{path:path}", methods=["GET", "HEAD"])
async def ui_file(path: str, request: Request) -> Response:
    """A file of the UI (`/ui/` is index.html: the pages route on the URL's #fragment)."""
    file = FILES.get(path or "index.html")
    if file is None:
        return Response(f"no such file in the UI: {path}\n", status_code=404, media_type="text/plain",
                        headers={**HEADERS, "Cache-Control": REVALIDATE})
    # a URL naming this content's version never changes meaning: cached for good; anything else is revalidated
    cache = IMMUTABLE if request.query_params.get("v") == file.version else REVALIDATE
    headers = {**HEADERS, "ETag": file.etag, "Cache-Control": cache}
    if file.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)
