"""``torchdata-gcs doctor``: check a bucket for everything torchdata-gcs relies on, with the user's own credentials.

It reads the bucket's settings, then makes, in a scratch folder under the prefix, the requests the library's
features make (list, conditional create, read, compose, XML multipart upload, delete), and says for each what a
failure means for which feature. Everything it wrote is deleted at the end, on Ctrl-C too.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from typing import Any

from .._ops.client import Client, GCSClient, client_of
from .._ops.objects import storage_layout
from .._ops.urls import format_url, parse_url
from .._transport.session import Session
from ..config import ClientConfig, RetryConfig
from ..errors import AccessDeniedError, EndpointError, GCSError, NotFoundError, TransientError
from .bucket_settings import BUCKET_FIELDS, FACT_NAMES, LAYOUT_FACTS, Fact, bucket_settings
from .doctor_checks import SAMPLE_SIZE, ScratchChecks
from .doctor_report import CHECKS, FAILED, MISSING, REFUSED, Report, one_line, table_row
from .lifecycle_rules import describe_rule, lifecycle_file, missing_rules

__all__ = ["RETRY", "SCRATCH_MARK", "doctor"]

SCRATCH_MARK = ".torchdata-gcs-doctor-"
"""The scratch folder is ``<prefix>.torchdata-gcs-doctor-<random>/``; nothing outside it is written."""

RETRY = RetryConfig(max_attempts=3, deadline=10.0, initial_delay=0.2, max_delay=2.0)
"""Short retries and timeouts: a dead endpoint fails in seconds, not minutes."""
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 20.0

_UNKNOWN = "unknown (no storage.buckets.get)"


def doctor(
    url: str,
    *,
    client: GCSClient | ClientConfig | None = None,
    say: Callable[[str], None] = lambda line: None,
    sample_size: int = SAMPLE_SIZE,
) -> Report:
    """Check ``url``'s bucket (``gs://bucket/prefix/``) through ``client`` (its timeouts replaced by short ones) and
    return the report; ``say`` is given each line of it as it is known. Ctrl-C (``KeyboardInterrupt``) stops the checks,
    cleans up and returns a report marked ``interrupted``. A bucket that does not exist or an endpoint that cannot be
    reached raises its ``GCSError``."""
    given = client_of(client)
    short = dataclasses.replace(given.config, connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT)
    run = _Run(url, GCSClient(short, transport=given.transport), say, sample_size)
    try:
        run.introduce()
        try:
            run.checks.check_all()
        except KeyboardInterrupt:
            run.report.interrupted = True
            say(
                f"interrupted after {len(run.report.checks)} of {len(CHECKS)} checks: cleaning up (Ctrl-C again "
                "leaves the scratch objects behind)"
            )
    finally:
        run.checks.clean_up()
    run.conclude()
    return run.report


class _Run:
    """One doctor run: the bucket's settings as read, the checks in its scratch folder, and the report as it grows."""

    def __init__(self, url: str, client: GCSClient, say: Callable[[str], None], sample_size: int) -> None:
        self.bucket, name = parse_url(url)
        # A name that does not end in "/" is a folder too, as list_files_by_gcs reads it.
        prefix = name if not name or name.endswith("/") else name + "/"
        scratch = f"{prefix}{SCRATCH_MARK}{secrets.token_hex(4)}/"
        self.config = client.config
        self.objects = Client(client, RETRY)
        self.say = say
        self.report = Report(url=format_url(self.bucket, prefix), scratch=format_url(self.bucket, scratch))
        self.checks = ScratchChecks(self.objects, self.bucket, prefix, scratch, self.report, say, sample_size)
        self.resource: dict[str, Any] | None = None  # the bucket's settings, if they could be read
        self.unread = "reading them needs storage.buckets.get"  # why not, if they could not

    # -- header ----------------------------------------------------------------------------------

    def introduce(self) -> None:
        report, say = self.report, self.say
        report.endpoint = self.objects.session.endpoint
        report.identity = _identity(self.objects.session)
        say(f"endpoint  {report.endpoint}")
        say(f"identity  {report.identity}")
        if self.config.user_project:
            say(f"billed to {self.config.user_project} (requester pays)")
        say(f"scratch   {report.scratch} (deleted at the end)")
        report.facts = self.bucket_facts()
        say("")
        say(f"bucket gs://{self.bucket}")
        width = max(len(fact.name) for fact in report.facts) + 2
        values = max(len(fact.value) for fact in report.facts) + 2
        for fact in report.facts:
            say(f"  {fact.name:<{width}}{fact.value:<{values}}{fact.meaning}".rstrip())
        self.advise_lifecycle()
        say("")
        say(table_row("check", "result", "detail"))

    def bucket_facts(self) -> list[Fact]:
        """The settings that change what temporary objects and overwrites cost; unknown without storage.buckets.get.
        A missing bucket or an unreachable endpoint raises: nothing else could work."""
        try:
            resource = self.objects.bucket(self.bucket, BUCKET_FIELDS)
        except AccessDeniedError:
            return self.layout_facts()
        except (NotFoundError, TransientError, EndpointError):
            raise
        except GCSError as exc:  # such as a requester-pays bucket asked without a user project
            self.unread = f"the bucket's settings could not be read ({one_line(exc)})"
            return [Fact(name, f"unknown ({one_line(exc)})") for name in FACT_NAMES]
        self.resource = resource
        self.checks.hierarchical = bool((resource.get("hierarchicalNamespace") or {}).get("enabled"))
        self.checks.retained = bool(resource.get("retentionPolicy"))
        self.checks.held = bool(resource.get("defaultEventBasedHold"))
        return bucket_settings(resource, self.config.user_project)

    def advise_lifecycle(self) -> None:
        """Print the lifecycle configuration that adds the rules for torchdata-gcs's leftovers the bucket lacks."""
        if self.resource is None:
            self.say(f"lifecycle rules not checked: {self.unread}")
            return
        current = self.resource.get("lifecycle")
        missing = missing_rules(current)
        if not missing:
            return
        self.report.lifecycle = lifecycle_file(current, missing)
        self.say("")
        self.say(
            "lifecycle rules to add, so that GCS itself removes what killed jobs leave (billed until removed): "
            + "; ".join(describe_rule(rule) for rule in missing)
        )
        self.say(
            "save this as lifecycle.json (the bucket's own rules are in it: the file replaces them) and run "
            f"`gcloud storage buckets update gs://{self.bucket} --lifecycle-file=lifecycle.json`:"
        )
        self.say(json.dumps(self.report.lifecycle, indent=2))

    def layout_facts(self) -> list[Fact]:
        """Without storage.buckets.get, the location and namespace from the storage layout (storage.objects.list
        suffices: object roles hold it); the other settings unknown."""
        try:
            layout = self.objects.run(storage_layout, self.bucket)
        except GCSError:
            return [Fact(name, _UNKNOWN) for name in FACT_NAMES]
        self.checks.hierarchical = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        known = {fact.name: fact for fact in bucket_settings(layout, self.config.user_project)}
        return [known[name] if name in LAYOUT_FACTS else Fact(name, _UNKNOWN) for name in FACT_NAMES]

    # -- the end ---------------------------------------------------------------------------------

    def conclude(self) -> None:
        report, say = self.report, self.say
        say("")
        for line in report.left_behind:
            say(f"could not remove {line}")
        removed = f"deleted {report.deleted} scratch object(s)"
        say(
            f"cleanup: {removed}; {len(report.left_behind)} item(s) left behind"
            if report.left_behind
            else f"cleanup: {removed}, nothing left behind"
        )
        if report.interrupted:
            say(f"verdict: interrupted after {len(report.checks)} of {len(CHECKS)} checks")
            return
        findings = report.findings
        for finding in findings:
            say(f"problem: {finding}")
        if findings:
            names = [
                f"{check.name} {check.result}" for check in report.checks if check.result in (REFUSED, MISSING, FAILED)
            ]
            names += ["cleanup incomplete"] if report.left_behind else []
            say(f"verdict: {len(findings)} problem(s) in {report.url}: {', '.join(names)}")
        else:
            say(f"verdict: OK, everything torchdata-gcs relies on works in {report.url}")


def _identity(session: Session) -> str:
    """Who the requests go out as: a service account's email, a user's account, else the credential type."""
    if session.anonymous:
        return "anonymous"
    try:
        session.authorization()  # refreshes the token; a metadata-server identity learns its email here
    except GCSError:
        raise
    except Exception as exc:  # noqa: BLE001 - the token endpoint could not be reached, say
        raise GCSError(f"could not get an access token: {type(exc).__name__}: {exc}") from None
    credentials = session.credentials
    if credentials is None:
        return "credentials of an unknown kind"
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return f"{email} (service account)"
    account = getattr(credentials, "account", None)
    if isinstance(account, str) and "@" in account:
        return f"{account} (user account)"
    kind = type(credentials)
    return f"{kind.__module__}.{kind.__qualname__}"
