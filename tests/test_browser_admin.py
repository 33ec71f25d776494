"""The admin as an operator meets it: in headless Chromium, through the live server.

Each test logs in through the admin's login form and works only with what a
person sees and clicks; between steps ``run_until_idle()`` plays the
executor (the commands run exactly as ``workflow_executor`` runs them), and
the page is reloaded to see the instance move on. Playwright's ``expect``
waits for what the page should show (no sleeps).

Machinery (tests/browser.py): Debian's ``chromium`` driven by Playwright's
Python package, skipped with the reason where there is none; a screenshot of
every step in ``artifacts/screenshots/``; with
``VERTIQUE_UPDATE_GUIDE_IMAGES=1`` the ones docs/operators-guide.md embeds
are written to docs/images/ as well.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

import vertique_workflow as wf
from tests.browser import (
    GUIDE_IMAGES,
    find_chromium,
    screenshot_dir,
    update_guide_images,
    why_no_browser,
)
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "browser-pass"
VIEWPORT = {"width": 1280, "height": 860}
EXPECT_TIMEOUT_MS = 20_000  # what a page should show; generous for a busy two-core CI machine


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module, or a skip that says why there is none.

    Playwright's sync API keeps an asyncio loop marked as running on this
    thread, and Django then refuses ORM calls "from an async context"
    although nothing here is async: ``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts that
    check while the browser lives. Module scope, so the loop is gone before
    the next module's tests run.
    """
    reason = why_no_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=find_chromium(), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Camera:
    """Numbered full-page screenshots of one test, kept as CI artifacts."""

    def __init__(self, page: Any, test_name: str) -> None:
        self.page = page
        self.prefix = re.sub(r"^test_", "", test_name)
        self.count = 0

    def shot(self, label: str, *, guide: str | None = None, focus: str | None = None) -> Path:
        """Screenshot the page; ``guide`` names the docs/images/ copy the guide embeds.

        ``focus`` (a selector) makes the guide's copy that element alone.
        """
        self.count += 1
        path = screenshot_dir() / f"{self.prefix}-{self.count:02d}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if guide and update_guide_images():
            GUIDE_IMAGES.mkdir(parents=True, exist_ok=True)
            # the viewport only: the guide's images stay small
            target = GUIDE_IMAGES / f"{guide}.png"
            if focus:
                self.page.locator(focus).first.screenshot(path=str(target))
            else:
                self.page.screenshot(path=str(target))
        assert path.stat().st_size > 0
        return path


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    """The operator: a superuser (model permissions and the task rule allow everything)."""
    return django_user_model.objects.create_superuser("olga", "olga@example.com", PASSWORD)


@pytest.fixture
def page(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    tab = context.new_page()
    tab.camera = Camera(tab, request.node.name)
    try:
        yield tab
    finally:
        context.close()


def log_in(page: Any, username: str = "olga", password: str = PASSWORD) -> None:
    """Log in through the admin's own form, as a person does."""
    from playwright.sync_api import expect

    page.goto(reverse("admin:login"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_text(re.compile(r"Welcome,", re.I))).to_be_visible()


def instance_url(instance_id: Any) -> str:
    return reverse("admin:vertique_workflow_workflowinstance_change", args=[instance_id])


def diagram_step(page: Any, step: str) -> Any:
    """The diagram's box of ``step`` (the SVG's ``<g class="step ..." data-step=...>``)."""
    return page.locator(f'#diagram svg g.step[data-step="{step}"]')


def test_an_operator_logs_in_and_follows_an_instance_on_its_diagram_and_history(
    page: Any, operator: Any
) -> None:
    from playwright.sync_api import expect

    ref = wf.start("order", {"amount": 5}, idempotency_key="browser-follow")
    run_until_idle()

    page.goto(reverse("admin:index"))
    expect(page).to_have_url(re.compile(r"/admin/login/"))  # nothing without logging in
    page.camera.shot("login")
    log_in(page)

    page.goto(reverse("admin:vertique_workflow_workflowinstance_changelist"))
    row = page.locator("#result_list tbody tr", has_text=str(ref.id)[:8])
    expect(row).to_contain_text("WAITING")
    expect(row).to_contain_text("await_payment")
    page.camera.shot("instances", guide="instances")

    # the instance page: its diagram highlights where it waits
    row.get_by_role("link").first.click()
    expect(page).to_have_url(re.compile(str(ref.id)))
    expect(diagram_step(page, "await_payment")).to_have_class(re.compile(r"\bcurrent\b"))
    expect(diagram_step(page, "reserve")).to_have_class(re.compile(r"\bvisited\b"))
    expect(diagram_step(page, "ship")).not_to_have_class(re.compile(r"\b(current|visited)\b"))
    page.camera.shot("instance-waiting", guide="instance", focus=".wf-columns")

    # the payment arrives; once the executor ran it the page shows the instance moved on
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="browser-follow-paid")
    run_until_idle()
    page.reload()
    expect(page.locator("#timeline")).to_contain_text("paid")
    expect(diagram_step(page, "ship")).to_have_class(re.compile(r"\bvisited\b"))
    expect(diagram_step(page, "await_payment")).not_to_have_class(re.compile(r"\bcurrent\b"))
    expect(page.locator("#content-main")).to_contain_text("COMPLETED")
    page.camera.shot("instance-completed")

    # choose the history entry where it waited: the state then, and where it stood
    waited = page.locator("#timeline tbody tr", has_text="WAITING for").first
    waited.get_by_role("link", name=re.compile(r"^#\d+$")).click()
    expect(page).to_have_url(re.compile(r"[?&]at=\d+"))
    past = page.locator("#state-at")
    expect(past).to_be_visible()
    then = page.locator("#state-at + *")  # the state right after that entry
    expect(then).to_contain_text("reserved")
    expect(then).not_to_contain_text("shipped")
    expect(page.locator("#timeline tr.wf-selected")).to_have_count(1)
    expect(diagram_step(page, "await_payment")).to_have_class(re.compile(r"\bcurrent\b"))
    expect(diagram_step(page, "ship")).not_to_have_class(re.compile(r"\bvisited\b"))
    page.camera.shot("instance-history-entry", guide="history", focus=".wf-columns")


def test_an_operator_completes_a_task_through_its_form_and_the_instance_moves_on(
    page: Any, operator: Any
) -> None:
    from playwright.sync_api import expect

    ref = wf.start("review", {"manager": "olga"}, idempotency_key="browser-task")
    run_until_idle()
    log_in(page)

    page.goto(reverse("admin:vertique_workflow_workflowtask_inbox"))
    row = page.locator("#result_list tbody tr", has_text="Review the claim")
    expect(row).to_contain_text(str(ref.id))
    page.camera.shot("inbox", guide="inbox")
    row.get_by_role("link", name="Decide").click()

    approve = page.locator("form", has=page.locator("input[type=submit][value='Approve']"))
    approve.get_by_label("Reason for the record").fill("checked the receipts")
    page.camera.shot("decide", guide="decide")
    approve.locator("input[type=submit]").click()
    expect(page.locator("ul.messagelist")).to_be_visible()
    page.camera.shot("decided")
    assert wf.tasks(status="OPEN", assignee="olga").items == []

    run_until_idle()  # the executor completes the task and runs the approval
    page.goto(instance_url(ref.id))
    expect(page.locator("#content-main")).to_contain_text("COMPLETED")
    expect(diagram_step(page, "approved")).to_have_class(re.compile(r"\bvisited\b"))
    expect(diagram_step(page, "rejected")).not_to_have_class(re.compile(r"\bvisited\b"))
    page.camera.shot("task-instance-completed")
    assert wf.get(ref.id).state["outcome"] == "approved"


def test_an_operator_sends_a_signal_and_the_executor_applies_it(page: Any, operator: Any) -> None:
    from playwright.sync_api import expect

    ref = wf.start("order", {"amount": 7}, idempotency_key="browser-signal")
    run_until_idle()
    log_in(page)
    page.goto(instance_url(ref.id))

    page.locator("#workflow-actions").get_by_role("link", name="Send a signal").click()
    page.get_by_label("Signal").select_option("paid")
    page.get_by_label("Payload (JSON)").fill('{"amount_paid": 7}')
    page.get_by_label("Reason for the record").fill("the bank confirmed by phone")
    page.camera.shot("signal-form", guide="signal")
    page.locator("#content-main input[type=submit].default").click()
    expect(page.locator("ul.messagelist")).to_be_visible()
    page.camera.shot("signal-recorded")

    run_until_idle()
    page.goto(instance_url(ref.id))
    expect(page.locator("#content-main")).to_contain_text("COMPLETED")
    expect(page.locator("#timeline")).to_contain_text("olga")  # the operator as the actor
    page.camera.shot("signal-applied")


@pytest.mark.usefixtures("reset_gates")
def test_an_operator_retries_a_failed_instance_once_the_cause_is_fixed(
    page: Any, operator: Any
) -> None:
    from playwright.sync_api import expect

    from tests.flows.workflows import Gate

    Gate.non_retryable = True  # the carrier refuses: the instance FAILS
    ref = wf.start("shipment", {"ref": "S-1"}, idempotency_key="browser-retry")
    run_until_idle()
    assert wf.get(ref.id).status == "FAILED"
    log_in(page)

    page.goto(
        reverse("admin:vertique_workflow_workflowinstance_changelist") + "?status__exact=FAILED"
    )
    expect(page.locator("#result_list")).to_contain_text("SHIPMENT_REFUSED")
    page.camera.shot("failed-instances", guide="failed")
    page.goto(instance_url(ref.id))
    page.camera.shot("failed-instance")

    Gate.non_retryable = False  # the cause is fixed
    page.locator("#workflow-actions").get_by_role("link", name="Retry").click()
    page.get_by_label("Reason for the record").fill("carrier contract renewed")
    page.camera.shot("retry-form", guide="retry")
    page.locator("#content-main input[type=submit].default").click()
    expect(page.locator("ul.messagelist")).to_be_visible()

    run_until_idle()
    page.goto(instance_url(ref.id))
    expect(diagram_step(page, "confirm_wait")).to_have_class(re.compile(r"\bcurrent\b"))
    expect(page.locator("#content-main")).to_contain_text("WAITING")
    page.camera.shot("retried")
