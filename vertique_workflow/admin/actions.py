"""The admin's write side: cancel, retry, signal, complete and reassign -- through the API.

Why every action goes through the public operations (``wf.cancel``,
``wf.retry``, ``wf.signal``, ``wf.complete_task``, ``wf.reassign_task``)
and never through the ORM: they take the execution lock, validate, record
history and write nothing when they refuse. The admin adds what an operator
needs around them:

- the admin user as the actor (``wf.Actor.user(username, reason=...)``,
  stored ASSERTED) and a required reason, kept with the command and its
  history entries;
- a hidden idempotency key (a UUID) in every form, passed as the
  operation's idempotency / dedup key, so a double submit records once;
- refusals as form errors or admin messages, never a 500.

Permissions: the instance actions (cancel, retry, signal, and the bulk
cancel / retry of the list) need the model permission
``vertique_workflow.change_workflowinstance`` -- the admin's own change form
stays read-only, so that permission means "may act on instances"; task
actions follow the task rule, ``wf.can_complete`` (assignee, candidate
user, candidate group, or ``vertique_workflow.change_workflowtask``).

Each action is a page of its own (GET shows the form, POST performs it,
CSRF-protected by ``admin_site.admin_view``); success redirects to the
instance's page with a message.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from .. import operations as ops
from ..context import Actor
from ..exceptions import (
    WorkflowConflict,
    WorkflowError,
    WorkflowNotFound,
    WorkflowValidationError,
    user_message,
)
from ..models import WorkflowInstance, WorkflowTask
from ..pins import signal_schema_source
from ..store import db
from ..store import instances as instance_rows
from .common import admin_url
from .schema_form import JSONTextField, PayloadSpec

logger = logging.getLogger(__name__)

INSTANCE_PERMISSION = "vertique_workflow.change_workflowinstance"
REASON_MAX = 255  # the actor_reason column
BULK_MAX = 200  # instances one bulk action handles (the confirmation page lists each)
TEMPLATES = "admin/vertique_workflow/actions"


# -- forms ---------------------------------------------------------------------------


class ActionForm(forms.Form):
    """The two fields of every action: a required reason and the hidden idempotency key.

    The key is drawn when the form is first shown (``initial`` is callable),
    so resubmitting the same page sends the same key and records once.
    """

    reason = forms.CharField(
        label="Reason for the record",
        max_length=REASON_MAX,
        widget=forms.TextInput(attrs={"size": 80}),
        help_text="Why: kept with the command and its history entries.",
    )
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)

    def key(self) -> str:
        return str(self.cleaned_data["idempotency_key"])


class CancelForm(ActionForm):
    pass


INSTANCE_TARGET = "instance"


class RetryForm(ActionForm):
    """Retry the instance, or one of its failed branches (``wf.retry(..., branch=...)``)."""

    target = forms.ChoiceField(label="Retry", widget=forms.RadioSelect)

    field_order = ("target", "reason", "idempotency_key")

    def __init__(self, *args: Any, branches: list[ops.BranchView], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(INSTANCE_TARGET, "the instance (a FAILED instance, or its dead letters)")]
        for branch in branches:
            value = json.dumps([branch.fork_step_id, branch.branch_id])
            label = f"the failed branch {branch.branch_id!r} of fork {branch.fork_step_id!r}"
            if branch.current_step:
                label += f" (at step {branch.current_step!r})"
            choices.append((value, label))
        self.fields["target"].choices = choices
        self.fields["target"].initial = INSTANCE_TARGET

    def branch(self) -> tuple[str, str] | None:
        value = self.cleaned_data["target"]
        if value == INSTANCE_TARGET:
            return None
        fork, branch = json.loads(value)
        return (fork, branch)


class SignalForm(ActionForm):
    """A declared signal and its payload as JSON (checked against the signal's schema)."""

    name = forms.ChoiceField(label="Signal")
    payload = JSONTextField(
        label="Payload (JSON)",
        help_text="Empty: no payload (null). Checked against the signal's schema.",
    )

    field_order = ("name", "payload", "reason", "idempotency_key")

    def __init__(self, *args: Any, declared: dict[str, Any] | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if declared is None:
            # a registry row from before signal declarations were stored admits every name
            self.fields["name"] = forms.CharField(
                label="Signal",
                max_length=255,
                help_text="This definition's row predates declared signals: any name is admitted.",
            )
        else:
            self.fields["name"].choices = [(name, name) for name in sorted(declared)]


class ReassignForm(ActionForm):
    assignee = forms.CharField(
        max_length=255,
        required=False,
        help_text="A user name; empty: nobody (the candidates remain).",
    )

    field_order = ("assignee", "reason", "idempotency_key")


class DecisionForm(ActionForm):
    """One decision of a task: its payload's fields (from the schema), reason and key."""

    def __init__(self, *args: Any, decision: str, schema: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", f"d-{decision}")
        super().__init__(*args, **kwargs)
        self.decision = decision
        self.spec = PayloadSpec.of(schema)
        reason, key = self.fields.pop("reason"), self.fields.pop("idempotency_key")
        self.spec.add_fields(self)
        self.fields["reason"], self.fields["idempotency_key"] = reason, key
        self.payload: Any = None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        self.payload = self.spec.payload(cleaned)
        failure = self.spec.check(self.payload, f"the payload of decision {self.decision!r}")
        if failure is not None:
            self.add_error(self.spec.error_field(), failure)
        return cleaned

    @property
    def schema_text(self) -> str | None:
        if self.spec.schema is None:
            return None
        return json.dumps(self.spec.schema, indent=2, sort_keys=True, ensure_ascii=False)


# -- helpers -------------------------------------------------------------------------


def user_actor(request: HttpRequest, reason: str) -> Actor:
    """The admin user as the actor of what this request records."""
    return Actor.user(request.user.get_username(), reason=reason)


def may_act_on_instances(user: Any) -> bool:
    """Whether ``user`` may cancel, retry or signal instances: the change permission."""
    return bool(getattr(user, "is_active", False) and user.has_perm(INSTANCE_PERMISSION))


def instance_url(instance_id: Any) -> str:
    return admin_url(WorkflowInstance, "change", instance_id)


def describe(exc: BaseException) -> str:
    """A refusal's text for the page; anything unexpected is logged, never shown raw."""
    if not isinstance(exc, WorkflowNotFound | WorkflowConflict | WorkflowValidationError):
        logger.warning("admin action failed", exc_info=exc)
    return user_message(exc)


def declared_signals(instance_id: Any) -> dict[str, Any] | None:
    """The signals the instance's pin declares, name -> payload schema (None: any name).

    The same source ``wf.signal`` checks against: the pinned registry row's
    declared names, or the resident plan's when no row exists yet.
    """
    row = instance_rows.get(ops._uuid(instance_id))
    if row is None:
        raise WorkflowNotFound("no workflow instance with that id")
    declared = signal_schema_source(row).declared
    return None if declared is None else dict(declared)


def atomic() -> Any:
    return transaction.atomic(using=db.alias())


def render(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    status: int = 200,
) -> TemplateResponse:
    opts = model_admin.model._meta
    full = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "app_label": opts.app_label,
        **context,
    }
    return TemplateResponse(request, f"{TEMPLATES}/{template}", full, status=status)


def refused(
    model_admin: admin.ModelAdmin, request: HttpRequest, title: str, message: str, back: str
) -> TemplateResponse:
    """A clear refusal page (403): what was refused and why, with a way back."""
    return render(
        model_admin,
        request,
        "refused.html",
        {"title": title, "message": message, "back_url": back},
        status=403,
    )


def _load_instance(
    model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str
) -> ops.InstanceView | HttpResponse:
    try:
        return ops.get(object_id)
    except WorkflowNotFound:
        messages.error(request, f"No workflow instance with id {object_id[:64]!r}.")
        return HttpResponseRedirect(admin_url(WorkflowInstance, "changelist"))


def _instance_permission(
    model_admin: admin.ModelAdmin, request: HttpRequest, what: str, object_id: str
) -> HttpResponse | None:
    if may_act_on_instances(request.user):
        return None
    return refused(
        model_admin,
        request,
        f"{what}: refused",
        f"You may not {what.lower()} workflow instances: it takes the permission "
        f"“{INSTANCE_PERMISSION}” (change workflow instance).",
        instance_url(object_id),
    )


# -- the instance actions ------------------------------------------------------------


def cancel_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """Cancel an instance (``wf.cancel``): its open commands, timers, tasks and branches too."""
    denied = _instance_permission(model_admin, request, "Cancel", object_id)
    if denied is not None:
        return denied
    instance = _load_instance(model_admin, request, object_id)
    if isinstance(instance, HttpResponse):
        return instance
    form = CancelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data["reason"]
        try:
            with atomic():
                cancelled = ops.cancel(
                    instance.id, reason=reason, actor=user_actor(request, reason)
                )
        except WorkflowError as exc:
            form.add_error(None, describe(exc))
        else:
            if cancelled:
                messages.success(request, f"Instance {instance.id} cancelled.")
            else:
                messages.info(
                    request,
                    f"Instance {instance.id} had already ended ({ops.get(instance.id).status}): "
                    "nothing was recorded.",
                )
            return HttpResponseRedirect(instance_url(instance.id))
    return render(
        model_admin,
        request,
        "instance_action.html",
        {
            "title": "Cancel the instance",
            "instance": instance,
            "form": form,
            "submit": "Cancel the instance",
            "explanation": "Cancelling ends the instance for good: its open commands, "
            "timers and tasks are cancelled and its live branches superseded. "
            "It cannot be retried afterwards.",
        },
    )


def retry_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """Retry a FAILED instance (and its dead letters), or one failed branch (``wf.retry``)."""
    denied = _instance_permission(model_admin, request, "Retry", object_id)
    if denied is not None:
        return denied
    instance = _load_instance(model_admin, request, object_id)
    if isinstance(instance, HttpResponse):
        return instance
    failed = [b for b in ops.branches(instance.id) if b.status == "FAILED"]
    form = RetryForm(request.POST or None, branches=failed)
    if request.method == "POST" and form.is_valid():
        reason, branch = form.cleaned_data["reason"], form.branch()
        try:
            with atomic():
                receipt = ops.retry(
                    instance.id,
                    actor=user_actor(request, reason),
                    reason=reason,
                    idempotency_key=form.key(),
                    branch=branch,
                )
        except WorkflowError as exc:
            form.add_error(None, describe(exc))
        else:
            what = "the instance" if branch is None else f"branch {branch[1]!r}"
            if receipt.duplicate:
                messages.info(
                    request,
                    f"A retry of {what} was already recorded (command {receipt.command_id}): "
                    "nothing new was recorded.",
                )
            else:
                messages.success(
                    request,
                    f"Retry of {what} recorded (command {receipt.command_id}); "
                    "the executor runs it next.",
                )
            return HttpResponseRedirect(instance_url(instance.id))
    return render(
        model_admin,
        request,
        "instance_action.html",
        {
            "title": "Retry",
            "instance": instance,
            "form": form,
            "submit": "Record the retry",
            "explanation": "Fix the cause first (deploy the code, restore the record): a retry "
            "runs the same code path again. A failed branch runs its failed step again while "
            "its join has not decided.",
        },
    )


def signal_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """Send one of the instance's declared signals (``wf.signal``), the payload as JSON."""
    denied = _instance_permission(model_admin, request, "Signal", object_id)
    if denied is not None:
        return denied
    instance = _load_instance(model_admin, request, object_id)
    if isinstance(instance, HttpResponse):
        return instance
    try:
        declared = declared_signals(instance.id)
    except WorkflowError as exc:
        messages.error(request, describe(exc))
        return HttpResponseRedirect(instance_url(instance.id))
    form = SignalForm(request.POST or None, declared=declared)
    if request.method == "POST" and form.is_valid():
        name, reason = form.cleaned_data["name"], form.cleaned_data["reason"]
        try:
            with atomic():
                receipt = ops.signal(
                    instance.id,
                    name,
                    form.cleaned_data["payload"],
                    dedup_key=form.key(),
                    actor=user_actor(request, reason),
                )
        except WorkflowValidationError as exc:
            # an undeclared name or a payload failing the schema: about the payload's field
            form.add_error("payload", describe(exc))
        except WorkflowError as exc:
            form.add_error(None, describe(exc))
        else:
            if receipt.duplicate:
                messages.info(
                    request, f"Signal {name!r} was already sent with this form: sent once."
                )
            else:
                messages.success(
                    request,
                    f"Signal {name!r} recorded (command {receipt.command_id}); "
                    "the executor applies it next.",
                )
            return HttpResponseRedirect(instance_url(instance.id))
    schemas = [
        (name, None if schema is None else json.dumps(schema, indent=2, ensure_ascii=False))
        for name, schema in sorted((declared or {}).items())
    ]
    return render(
        model_admin,
        request,
        "signal.html",
        {
            "title": "Send a signal",
            "instance": instance,
            "form": form,
            "submit": "Send the signal",
            "schemas": schemas,
            "any_name": declared is None,
            "no_signals": declared == {},
        },
    )


# -- bulk cancel / retry on the list -------------------------------------------------


class BulkForm(ActionForm):
    pass


def _bulk(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    *,
    action: str,
    title: str,
    explanation: str,
) -> TemplateResponse | None:
    """The confirmation page of a bulk action, or (confirmed) its per-instance outcomes.

    Each instance is its own transaction: one refusal or error does not stop
    (or undo) the others; every outcome is an admin message.
    """
    rows = list(
        queryset.order_by("id").values(
            "id", "definition_id", "definition_version", "status", "business_key"
        )[: BULK_MAX + 1]
    )
    if len(rows) > BULK_MAX:
        messages.error(
            request,
            f"At most {BULK_MAX} instances at a time: narrow the selection (filters, search).",
        )
        return None
    form = BulkForm(request.POST if request.POST.get("post") == "yes" else None)
    if form.is_bound and form.is_valid():
        reason, key = form.cleaned_data["reason"], form.key()
        perform = _bulk_cancel if action == "cancel_selected" else _bulk_retry
        for row in rows:
            perform(request, row["id"], reason, key)
        return None
    return render(
        model_admin,
        request,
        "bulk_confirmation.html",
        {
            "title": title,
            "explanation": explanation,
            "rows": rows,
            "form": form,
            "action": action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "submit": title,
        },
    )


def _bulk_cancel(request: HttpRequest, instance_id: Any, reason: str, key: str) -> None:
    try:
        with atomic():
            cancelled = ops.cancel(instance_id, reason=reason, actor=user_actor(request, reason))
    except WorkflowError as exc:
        messages.error(request, f"{instance_id}: not cancelled: {describe(exc)}")
        return
    if cancelled:
        messages.success(request, f"{instance_id}: cancelled.")
    else:
        messages.warning(request, f"{instance_id}: had already ended; nothing recorded.")


def _bulk_retry(request: HttpRequest, instance_id: Any, reason: str, key: str) -> None:
    try:
        with atomic():
            # one key for the whole submission: keys are per instance, so a double
            # submit of the confirmation page records each instance's retry once
            receipt = ops.retry(
                instance_id, actor=user_actor(request, reason), reason=reason, idempotency_key=key
            )
    except WorkflowError as exc:
        messages.error(request, f"{instance_id}: not retried: {describe(exc)}")
        return
    if receipt.duplicate:
        messages.warning(
            request, f"{instance_id}: a retry was already recorded (command {receipt.command_id})."
        )
    else:
        messages.success(request, f"{instance_id}: retry recorded (command {receipt.command_id}).")


class InstanceActions:
    """Mixin of the instances' ModelAdmin: the action pages and the bulk actions of the list."""

    actions = ("cancel_selected", "retry_selected")

    def has_workflow_action_permission(self, request: HttpRequest) -> bool:
        return may_act_on_instances(request.user)

    @admin.action(description="Cancel the selected instances…", permissions=["workflow_action"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> Any:
        return _bulk(
            self,  # type: ignore[arg-type]
            request,
            queryset,
            action="cancel_selected",
            title="Cancel the selected instances",
            explanation="Each instance is cancelled for good (its open commands, timers, tasks "
            "and branches too); instances that have already ended are left as they are.",
        )

    @admin.action(description="Retry the selected instances…", permissions=["workflow_action"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> Any:
        return _bulk(
            self,  # type: ignore[arg-type]
            request,
            queryset,
            action="retry_selected",
            title="Retry the selected instances",
            explanation="A RETRY command is recorded for each FAILED instance or instance "
            "holding dead letters; the others are refused, one by one.",
        )

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        opts = self.model._meta  # type: ignore[attr-defined]
        prefix = f"{opts.app_label}_{opts.model_name}"

        def view(function: Any) -> Any:
            return wrap(lambda request, object_id: function(self, request, object_id))

        from .doctor import doctor_view

        return [
            path("doctor/", wrap(lambda r: doctor_view(self, r)), name=f"{prefix}_doctor"),
            path("<path:object_id>/cancel/", view(cancel_view), name=f"{prefix}_cancel"),
            path("<path:object_id>/retry/", view(retry_view), name=f"{prefix}_retry"),
            path("<path:object_id>/signal/", view(signal_view), name=f"{prefix}_signal"),
            *super().get_urls(),  # type: ignore[misc]
        ]


def workflow_actions(request: HttpRequest, obj: WorkflowInstance | None) -> str:
    """The action buttons of an instance's page (the slot the read side leaves).

    On the list (``obj`` None): a link to the task inbox (the bulk actions
    are in the list's action menu). Costs one query (the instance's open
    tasks) whatever the history length.
    """
    if obj is None:
        return render_to_string(
            f"{TEMPLATES}/list_links.html",
            {
                "inbox_url": admin_url(WorkflowTask, "inbox"),
                "doctor_url": admin_url(WorkflowInstance, "doctor"),
            },
            request=request,
        )
    return render_to_string(
        f"{TEMPLATES}/instance_buttons.html",
        {
            "links": instance_action_links(request, obj),
            "tasks": open_task_links(request, obj.pk),
            "may_act": may_act_on_instances(request.user),
            "ended": obj.status in instance_rows.ENDED,
        },
        request=request,
    )


def instance_action_links(request: HttpRequest, instance: Any) -> list[tuple[str, str]]:
    """The (label, url) of the actions this user may take on ``instance`` (for its page).

    Retry is offered on every instance that has not ended: its page lists the
    failed branches and the operation explains a refusal (nothing to retry).
    """
    if not may_act_on_instances(request.user) or instance.status in instance_rows.ENDED:
        return []
    return [
        ("Send a signal", admin_url(WorkflowInstance, "signal", instance.pk)),
        ("Retry", admin_url(WorkflowInstance, "retry", instance.pk)),
        ("Cancel", admin_url(WorkflowInstance, "cancel", instance.pk)),
    ]


OPEN_TASK_LINKS = 10


def task_view_of(row: WorkflowTask) -> ops.TaskView:
    """The ``TaskView`` of an ORM task row (for ``can_complete``, without another read)."""
    candidates = row.candidates_json if isinstance(row.candidates_json, dict) else {}
    snapshot = row.decisions_snapshot_json if isinstance(row.decisions_snapshot_json, dict) else {}
    return ops.TaskView(
        id=row.id,
        instance_id=row.workflow_id,
        step_id=row.step_id,
        name=row.name,
        status=row.status,
        assignee=row.assignee,
        candidate_users=tuple(candidates.get("users") or ()),
        candidate_groups=tuple(candidates.get("groups") or ()),
        decisions=tuple(snapshot),
        decision=row.decision,
        result=row.result_json,
        due_at=row.due_at,
        scope=row.scope_key,
        definition_id=None,
        version=row.version,
        reservation_command_id=row.reservation_command_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        completed_at=row.completed_at,
    )


def open_task_links(request: HttpRequest, instance_id: Any) -> list[dict[str, Any]]:
    """The instance's OPEN tasks this user may act on, with their decide / reassign links."""
    rows = WorkflowTask.objects.filter(workflow_id=instance_id, status="OPEN").order_by(
        "created_at"
    )[:OPEN_TASK_LINKS]
    links = []
    for row in rows:
        if not ops.can_complete(request.user, task_view_of(row)):
            continue
        links.append(
            {
                "name": row.name,
                "decide": admin_url(WorkflowTask, "complete", row.id),
                "reassign": admin_url(WorkflowTask, "reassign", row.id),
            }
        )
    return links


# -- the task actions ----------------------------------------------------------------


def _load_task(request: HttpRequest, object_id: str) -> ops.TaskView | HttpResponse:
    try:
        return ops.get_task(object_id)
    except WorkflowNotFound:
        messages.error(request, f"No task with id {object_id[:64]!r}.")
        return HttpResponseRedirect(admin_url(WorkflowTask, "changelist"))


def _task_refusal(
    model_admin: admin.ModelAdmin, request: HttpRequest, task: ops.TaskView, what: str
) -> HttpResponse | None:
    if ops.can_complete(request.user, task):
        return None
    return refused(
        model_admin,
        request,
        f"{what}: refused",
        f"You may not {what.lower()} the task {task.name!r}: only its assignee, its candidate "
        "users and groups, and users with the permission "
        f"“{ops.TASK_PERMISSION}” may act on it.",
        instance_url(task.instance_id),
    )


def decision_forms(
    task: ops.TaskView, data: Any = None, bound: str | None = None
) -> list[DecisionForm]:
    """One form per declared decision (``bound``: the one ``data`` was posted to)."""
    snapshot = (
        WorkflowTask.objects.filter(id=task.id)
        .values_list("decisions_snapshot_json", flat=True)
        .first()
    ) or {}
    return [
        DecisionForm(
            data if name == bound else None,
            decision=name,
            schema=(snapshot.get(name) or {}).get("payloadSchema"),
        )
        for name in task.decisions
    ]


def complete_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """A task's decision forms (GET), and one decision's completion (POST).

    The posted form names its decision in a ``decision`` field (a decision
    name is free text, so it is not part of the URL).
    """
    task = _load_task(request, object_id)
    if isinstance(task, HttpResponse):
        return task
    denied = _task_refusal(model_admin, request, task, "Decide")
    if denied is not None:
        return denied
    posted = request.POST.get("decision", "") if request.method == "POST" else None
    if posted is not None and posted not in task.decisions:
        messages.error(
            request,
            f"The task {task.name!r} declares no decision {posted[:64]!r} "
            f"(allowed: {', '.join(task.decisions) or 'none'}).",
        )
        return HttpResponseRedirect(admin_url(WorkflowTask, "complete", task.id))
    forms_ = decision_forms(task, request.POST, posted)
    form = next((f for f in forms_ if f.decision == posted), None)
    if form is not None and form.is_valid():
        reason = form.cleaned_data["reason"]
        try:
            with atomic():
                receipt = ops.complete_task(
                    task.id,
                    form.decision,
                    form.payload,
                    idempotency_key=form.key(),
                    actor=user_actor(request, reason),
                )
        except WorkflowError as exc:
            form.add_error(None, describe(exc))
        else:
            if receipt.duplicate:
                messages.info(
                    request,
                    f"{task.name}: this decision was already recorded (the form was sent twice).",
                )
            else:
                messages.success(
                    request,
                    f"{task.name}: {form.decision!r} recorded by {request.user.get_username()}; "
                    "the executor completes the task next.",
                )
            if request.GET.get("from") == "inbox":
                return HttpResponseRedirect(admin_url(WorkflowTask, "inbox"))
            return HttpResponseRedirect(instance_url(task.instance_id))
    return render(
        model_admin,
        request,
        "task_complete.html",
        {
            "title": f"Decide: {task.name}",
            "task": task,
            "forms": forms_,
            "open": task.status == "OPEN",
            "instance_url": instance_url(task.instance_id),
            "from_inbox": request.GET.get("from") == "inbox",
        },
    )


def reassign_view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """Give an OPEN task another assignee (``wf.reassign_task``)."""
    task = _load_task(request, object_id)
    if isinstance(task, HttpResponse):
        return task
    denied = _task_refusal(model_admin, request, task, "Reassign")
    if denied is not None:
        return denied
    form = ReassignForm(request.POST or None, initial={"assignee": task.assignee or ""})
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data["reason"]
        assignee = form.cleaned_data["assignee"].strip() or None
        try:
            with atomic():
                result = ops.reassign_task(
                    task.id,
                    assignee=assignee,
                    idempotency_key=form.key(),
                    actor=user_actor(request, reason),
                )
        except WorkflowError as exc:
            form.add_error(None, describe(exc))
        else:
            if result.duplicate:
                messages.info(request, f"{task.name}: already reassigned with this form.")
            else:
                messages.success(
                    request,
                    f"{task.name}: reassigned from {result.previous_assignee or 'nobody'} "
                    f"to {result.assignee or 'nobody'}.",
                )
            return HttpResponseRedirect(instance_url(task.instance_id))
    return render(
        model_admin,
        request,
        "task_reassign.html",
        {
            "title": f"Reassign: {task.name}",
            "task": task,
            "form": form,
            "submit": "Reassign",
            "instance_url": instance_url(task.instance_id),
        },
    )


class TaskActions:
    """Mixin of the tasks' ModelAdmin: the decision and reassignment pages, and the inbox."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        links = render_to_string(
            f"{TEMPLATES}/list_links.html",
            {"inbox_url": admin_url(WorkflowTask, "inbox")},
            request=request,
        )
        context = {"workflow_actions": links, **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)  # type: ignore[misc]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        found = WorkflowTask.objects.filter(pk=object_id) if _is_uuid(object_id) else None
        row = None if found is None else found.first()
        links = [] if row is None else task_action_links(request, task_view_of(row))
        context = {"workflow_task_links": links, **(extra_context or {})}
        parent = super()
        return parent.change_view(request, object_id, form_url, extra_context=context)  # type: ignore[misc]

    def get_urls(self) -> list[URLPattern]:
        from .inbox import inbox_view

        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        opts = self.model._meta  # type: ignore[attr-defined]
        prefix = f"{opts.app_label}_{opts.model_name}"
        return [
            path("inbox/", wrap(lambda r: inbox_view(self, r)), name=f"{prefix}_inbox"),
            path(
                "<path:object_id>/complete/",
                wrap(lambda r, object_id: complete_view(self, r, object_id)),
                name=f"{prefix}_complete",
            ),
            path(
                "<path:object_id>/reassign/",
                wrap(lambda r, object_id: reassign_view(self, r, object_id)),
                name=f"{prefix}_reassign",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def task_action_links(request: HttpRequest, task: Any) -> list[tuple[str, str]]:
    """The (label, url) of the actions this user may take on an OPEN ``task``."""
    if task.status != "OPEN" or not ops.can_complete(request.user, task):
        return []
    return [
        ("Decide", admin_url(WorkflowTask, "complete", task.id)),
        ("Reassign", admin_url(WorkflowTask, "reassign", task.id)),
    ]
