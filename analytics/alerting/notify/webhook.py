"""Receiver kind ``webhook``: any URL that takes Alertmanager's webhook payload, delivered
by notify/http.py."""

from __future__ import annotations

from .receivers import RECEIVERS, HttpKind


@RECEIVERS.register
class Webhook(HttpKind):
    name = "webhook"
    FLAG = "--alert-webhook"
    FLAG_HELP = ("POST alerts to this URL in Alertmanager's webhook format (repeatable; metrics and logs "
                 "name it NAME, else its host only; user:password in the URL goes as Basic auth)")
