"""The web UI: static files (HTML, ES modules, CSS, the vendored chart library) served under /ui by the API process.

The pages call the same endpoints as any client, with the API key the user typed (kept in sessionStorage, sent
as `X-API-Key`), so they can show nothing a key could not read. No build step, no CDN: everything the browser
loads comes from `query_api/ui/` (package data).

The files (about 150 KB) are read once, at import, and served from memory with a content hash as ETag and
`Cache-Control: no-cache`: a browser revalidates every file on every load (an upgraded API never runs with stale
modules) and each answer is a dictionary lookup. StaticFiles' stat and read on the thread pool, one file after the
other, cost a cold counter page more than half its load time. Edits to the files need an API restart.

Every response carries a Content-Security-Policy allowing only this origin's scripts and styles, so a counter
name or a dead letter's record can never run as script.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".md": "text/plain; charset=utf-8", "": "text/plain; charset=utf-8"}


@dataclass(frozen=True, slots=True)
class UiFile:
    body: bytes
    media_type: str
    etag: str


def load_files(directory: Path = UI_DIR) -> dict[str, UiFile]:
    """Every file under `directory` by its path relative to it ("js/app.js")."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            body = path.read_bytes()
            media_type = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            files[path.relative_to(directory).as_posix()] = UiFile(body, media_type,
                                                                  f'"{hashlib.sha256(body).hexdigest()[:24]}"')
    return files


FILES = load_files()

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
                        headers=HEADERS)
    headers = {**HEADERS, "ETag": file.etag}
    if file.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)
