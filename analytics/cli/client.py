"""Where ``analyze`` gets its answers: ``Local`` (the library on a database file) or
``Remote`` (the collector's HTTP API, the same library on its live database). Both return
the library's own types, so what is printed does not depend on which.

A collector holding a database writes ``DB.service.json`` beside it. The client trusts that
file only when it is owned by the database file's owner (or root), is writable by nobody
else, is a plain file, and names the database it sits beside; otherwise it is ignored with
a note, and no token is sent anywhere. A token ($CMDARE_HTTP_TOKEN) goes only to a URL the
user named (``--server``) or one read from a trusted service file.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .. import api, codec
from ..db import AnalyticsError, Database, read_text_file
from ..resources import BY_NAME, SERVICE_SUFFIX, TOKEN_ENV, service_file  # noqa: F401  (the service's side of them)

CA_ENV = "CMDARE_HTTP_CA"
TIMEOUT = 660.0  # seconds: above the server's longest limit


def trusted_service(db: str | Path) -> tuple[str | None, str]:
    """(URL of a live collector serving ``db``, or None; why not, when a file was there but
    is not trusted)."""
    f = service_file(db)
    try:
        st = os.lstat(f)
    except OSError:
        return None, ""
    try:
        owner = os.stat(db).st_uid
    except OSError:
        return None, ""
    if not stat.S_ISREG(st.st_mode):
        return None, f"{f}: not a plain file: ignored"
    if st.st_uid not in (owner, 0):
        return None, f"{f}: owned by uid {st.st_uid}, not the database's owner: ignored"
    if st.st_mode & 0o022:
        return None, f"{f}: writable by others: ignored"
    try:
        info = json.loads(f.read_text()[:4096])
        pid, url, served = int(info["pid"]), str(info["url"]), str(info["db"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{f}: unreadable: ignored"
    if os.path.realpath(served) != os.path.realpath(db):
        return None, f"{f}: names another database ({served[:80]}): ignored"
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return None, f"{f}: not an http(s) URL: ignored"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None, ""  # a stale file: that collector is gone
    except PermissionError:
        pass  # alive, another user's
    except (OverflowError, ValueError):
        return None, f"{f}: bad pid: ignored"
    return url, ""


class Local:
    """The library on a database file opened per call."""

    def __init__(self, db: str) -> None:
        self.db = Database(db)
        self.path = db

    def call(self, name: str, **kw: Any) -> Any:
        return getattr(api, name)(self.db, **kw)


class Remote:
    """The same calls through a collector's API."""

    def __init__(self, url: str, path: str = "") -> None:
        self.url = url.rstrip("/")
        self.path = path

    def request(self, method: str, route: str, params: dict[str, Any] | None = None,
                body: dict[str, Any] | None = None) -> Any:
        q = {k: v for k, v in (params or {}).items() if v is not None and v != [] and v != ()}
        url = self.url + route + ("?" + urllib.parse.urlencode(q, doseq=True) if q else "")
        req = urllib.request.Request(url, method=method, headers={"Accept": "application/json"},
                                     data=None if body is None else json.dumps(codec.plain(body)).encode())
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if os.environ.get(TOKEN_ENV):
            req.add_header("Authorization", f"Bearer {os.environ[TOKEN_ENV].strip()}")
        ctx = ssl.create_default_context(cafile=os.environ.get(CA_ENV) or None) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=ctx) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise AnalyticsError(f"the collector's API at {self.url}: unauthorized: set ${TOKEN_ENV}") from None
            try:
                msg = json.loads(e.read(4096)).get("error")
            except (ValueError, AttributeError):
                msg = None
            if isinstance(msg, str) and msg:
                raise AnalyticsError(msg) from None
            raise AnalyticsError(f"the collector's API at {self.url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise AnalyticsError(f"the collector's API at {self.url} does not answer ({reason})") from None

    def call(self, name: str, **kw: Any) -> Any:
        """Library call ``name`` as its resource (cmdare.analytics.resources): the table's
        routes are called from their declaration; a custom one by its method here."""
        r = BY_NAME.get(name)
        if r is None or r.custom:
            return getattr(self, "_" + name)(**kw)
        route = r.route.format(**{p: _seg(str(kw.pop(p))) for p in r.path_params})
        alias = {p.name: p.alias for p in r.params if p.alias}
        d = self.request(r.method, route, _params({alias.get(k, k): v for k, v in kw.items()}))
        if r.answer == "table":
            cols, rows = codec.table_rows(d)
            return api.Table(cols, rows, [str(n)[:500] for n in (d.get("notes") or [])[:20]])
        return codec.unplain(d)

    # -- the custom resources: their request and their result rebuilt ---------------------------
    def _sql(self, query: str, max_rows: int | None = None, timeout: float | None = None) -> Any:
        from ..safesql import SqlResult

        d = self.request("POST", "/api/v1/sql", body={"query": query, "max_rows": max_rows, "timeout": timeout})
        cols, rows = codec.table_rows(d)
        return SqlResult(cols, rows, bool(d.get("truncated")), str(d.get("cut_by") or ""))

    def _bottlenecks(self, job: str | None = None, since: Any = None, kinds: list[str] | None = None,
                     options: dict[str, Any] | None = None, store: bool = True) -> api.Bottlenecks:
        d = self.request("POST", "/api/v1/findings/run", body={
            "job": job, "since": since, "kinds": list(kinds or []), "options": options or {}, "store": store})
        from ..findings import NextStep

        nxt = [NextStep(n["kind"], n["job"], n["command"], bool(n["ok"]), n.get("answer") or "", n.get("reason") or "")
               for n in d.get("next") or []]
        return api.Bottlenecks([codec.finding(f) for f in d["findings"]], d["skipped"], d["ran"], d["stored"],
                               d["not_stored"], nxt)

    def _alerts(self, rule: str | None = None) -> api.Alerts:
        d = self.request("GET", "/api/v1/alerts", {"rule": rule})
        cols, rows = codec.table_rows(d["alerts"])
        _, health = codec.table_rows(d["rules"])
        return api.Alerts(cols, rows, health)

    def _check_rules(self, files: list[tuple[str, str]]) -> api.RulesChecked:
        d = self.request("POST", "/api/v1/alerts/check", body={"files": [{"name": n, "text": t} for n, t in files]})
        return api.RulesChecked(d["files"], d["groups"], d["rules"])

    def _fit(self, kind: str, lost_after: float = 3) -> api.FitResult:
        d = codec.unplain(self.request("POST", f"/api/v1/fits/{_seg(kind)}", body={"lost_after": lost_after}))
        return api.FitResult(d["kind"], d["summary"], d["cv"], d["model"])

    def _predict_speed(self, gpu_type: str, model: api.ModelSpec | None = None, from_job: str | None = None,
                       batch_size: int | None = None) -> dict[str, Any]:
        return codec.unplain(self.request("GET", "/api/v1/predictions/speed", {
            "gpu_type": gpu_type, "from_job": from_job, "batch_size": batch_size, **_model(model)}))

    def _predict_cluster(self, gpus: list[tuple[str, int]], ps: int, model: api.ModelSpec | None = None,
                         from_job: str | None = None, batch_size: int | None = None) -> dict[str, Any]:
        return codec.unplain(self.request("GET", "/api/v1/predictions/cluster", {
            "gpus": ",".join(f"{t or '-'}:{n}" for t, n in gpus), "ps": ps, "from_job": from_job,
            "batch_size": batch_size, **_model(model)}))

    def _recommend(self, kind: str, **options: Any) -> list[Any]:
        table = api.recommender_options(kind)  # what equals its default need not travel
        for k in api.PATH_OPTIONS:  # the service reads no client-named file: send its text
            if options.get(k) and f"{k}_text" in table:
                options[f"{k}_text"] = _read_local(options[k])  # the path then only names it
        sent = {k: v for k, v in options.items() if k not in table or v != table[k].default}
        d = self.request("GET", f"/api/v1/recommendations/{_seg(kind.replace('_', '-'))}", _params(sent))
        return [codec.recommendation(r) for r in d]

    def _import_overheads(self, kind: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/imports/{_seg(kind)}", body={"records": records})

    def _job_detail(self, job: str) -> dict[str, api.Table]:
        d = self.request("GET", f"/api/v1/jobs/{_seg(job)}")
        return {k: api.Table(*codec.table_rows(v)) for k, v in d.items() if k != "job"}

    def _gpu_heatmap(self, since: Any = None, until: Any = None, columns: int = 120, label: str | None = None,
                     group: str = "auto", job: str | None = None, node: str | None = None) -> Any:
        return self.request("GET", "/api/v1/fleet/heatmap",
                            _params({"since": since, "until": until, "columns": columns, "label": label,
                                     "group": group, "job": job, "node": node}))

    def _stored_fits(self) -> Any:
        return codec.unplain(self.request("GET", "/api/v1/fits")["fits"])

    def _import_trace_rank(self, job: str, rank: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/imports/trace", body={"job": job, "rank": rank})

    def _import_events(self, job: str, lines: list[bytes]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/imports", body={"job": job, "events": [x.decode() for x in lines]})


def _read_local(path: str, limit: int = 64 << 10) -> str:
    """A file the user named, read here to be sent (at most 64 KiB: it travels in a URL)."""
    return read_text_file(path, limit, "a file to send to the collector")


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _params(kw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in kw.items():
        if hasattr(v, "isoformat"):
            v = v.isoformat()
        elif isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, float):
            v = repr(v)
        out[k] = v
    return out


def _model(m: api.ModelSpec | None) -> dict[str, Any]:
    if m is None:
        return {}
    return {"flops_per_step": repr(m.flops_per_step), "params": repr(m.params), "tensors": m.tensors,
            "batch_size": m.batch_size}


def backend(db: str, server: str | None) -> Local | Remote:
    """The collector named with --server, else the one holding ``db`` (a trusted service
    file), else the file itself."""
    if server:
        return Remote(server, db)
    url, why = trusted_service(db)
    if why:
        print(f"note: {why}", file=sys.stderr)
    return Remote(url, db) if url else Local(db)
