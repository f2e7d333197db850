"""Receiver kind ``alertmanager``: Alertmanager's v2 API (``POST URL/api/v2/alerts``),
delivered by notify/http.py with Alertmanager's client semantics."""

from __future__ import annotations

from .receivers import RECEIVERS, HttpKind


@RECEIVERS.register
class Alertmanager(HttpKind):
    name = "alertmanager"
    FLAG = "--alertmanager"
    FLAG_ENVVAR = "CMDARE_ALERTMANAGER"
    FLAG_HELP = ("deliver alerts to this Alertmanager (its v2 API; repeatable; $CMDARE_ALERTMANAGER; "
                 "named as --alert-webhook)")
