"""needs_review is resolvable: POST /v1/jobs/{id}/review through the real API, Redis and workers."""

from __future__ import annotations

import json
import threading
import time

import httpx
from tests.harness.jobs import wait_terminal

#: A model's output that fails its check ("后天" is no date this tool takes) with no decider to re-ask: review.
UNCHECKED = '{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}'


def _in_review(client: httpx.Client) -> dict:
    created = client.post("/v1/jobs", json={"raw_output": UNCHECKED, "tools": ["get_weather"]})
    assert created.status_code == 202, created.text
    job = wait_terminal(client, created.json()["job_id"])
    assert job["status"] == "needs_review", job
    return job


def test_reviewed_calls_run_as_a_step_of_the_reviewer(client: httpx.Client) -> None:
    job = _in_review(client)
    reviewed = client.post(f"/v1/jobs/{job['job_id']}/review", json={"calls": [
        {"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]})
    assert reviewed.status_code == 200, reviewed.text
    done = wait_terminal(client, job["job_id"])
    assert done["status"] == "succeeded", done
    (call,) = done["calls"]
    assert call["result"]["city"] == "Beijing" and call["step"] == 1
    assert call["approval"]["by"] == "reviewer"
    first, second = done["steps"][:2]
    assert first["review"]["outcome"] == "calls" and first["attempts"][0]["raw_output"] == UNCHECKED  # the model's, kept
    assert second["decided_by"] == "reviewer"


def test_a_reviewer_answer_ends_the_run(client: httpx.Client) -> None:
    job = _in_review(client)
    reviewed = client.post(f"/v1/jobs/{job['job_id']}/review", json={"answer": "No forecast for the day after tomorrow."})
    assert reviewed.status_code == 200, reviewed.text
    done = client.get(f"/v1/jobs/{job['job_id']}").json()
    assert done["status"] == "succeeded" and done["content"] == "No forecast for the day after tomorrow."
    assert done["calls"] == []


def test_a_rejection_is_seen_when_deciding_again(client: httpx.Client, runtime) -> None:
    from dataclasses import replace

    from executor.runs.review import review

    job = _in_review(client)
    refused = client.post(f"/v1/jobs/{job['job_id']}/review", json={"reject": "ask which day they mean"})
    assert refused.status_code == 422, refused.text  # this deployment has no decider to decide again
    assert client.get(f"/v1/jobs/{job['job_id']}").json()["status"] == "needs_review"
    deciding = replace(runtime, settings=runtime.settings.model_copy(update={"decider": "embedded"}))
    queued = []
    again = review(deciding, job["job_id"], tenant="default", reject="ask which day they mean",
                   dispatch=lambda *_: None, next_step=queued.append)
    assert again.status == "queued" and again.step == 1 and [j.job_id for j in queued] == [job["job_id"]]
    assert again.messages[-1] == {"role": "system", "content": "A reviewer rejected the proposed tool calls: ask which "
                                  "day they mean"}  # what the model decides on next


def test_bad_reviews_are_typed_and_change_nothing(client: httpx.Client) -> None:
    job = _in_review(client)
    url = f"/v1/jobs/{job['job_id']}/review"
    wrong = client.post(url, json={"calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "后天"}}]})
    assert wrong.status_code == 422 and wrong.json()["error"]["details"]["errors"][0]["path"] == "/date", wrong.text
    unknown = client.post(url, json={"calls": [{"name": "transfer_all", "arguments": {}}]})
    assert unknown.status_code == 422, unknown.text
    both = client.post(url, json={"answer": "x", "reject": "y"})
    assert both.status_code == 422 and both.json()["error"]["type"] == "validation_error"
    assert client.get(f"/v1/jobs/{job['job_id']}").json()["status"] == "needs_review"
    assert client.post("/v1/jobs/job_00000000000000000000000000000000/review", json={"answer": "x"}).status_code == 404


def test_concurrent_reviews_have_exactly_one_winner(api: str) -> None:
    with httpx.Client(base_url=api, timeout=30) as client:
        jobs = [_in_review(client) for _ in range(5)]
    for job in jobs:
        answers: list[httpx.Response] = []

        def answer(text: str, job_id: str = job["job_id"]) -> None:
            with httpx.Client(base_url=api, timeout=30) as own:
                answers.append(own.post(f"/v1/jobs/{job_id}/review", json={"answer": text}))

        threads = [threading.Thread(target=answer, args=(f"answer {n}",)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        codes = sorted(r.status_code for r in answers)
        assert codes == [200, 409, 409, 409, 409, 409], [r.text for r in answers]
        (winner,) = [r for r in answers if r.status_code == 200]
        with httpx.Client(base_url=api, timeout=30) as client:
            assert client.get(f"/v1/jobs/{job['job_id']}").json()["content"] == winner.json()["content"]
        loser = next(r for r in answers if r.status_code == 409).json()["error"]
        assert loser["details"]["job_status"] == "succeeded"


def test_a_review_whose_work_cannot_be_queued_ends_the_job(client: httpx.Client, runtime) -> None:
    from dataclasses import replace

    import pytest

    from executor.errors import StoreUnavailableError
    from executor.runs.review import review

    def refused(_job) -> None:  # noqa: ANN001 - the broker refusing the next decide step
        raise ConnectionError("broker down")

    job = _in_review(client)
    deciding = replace(runtime, settings=runtime.settings.model_copy(update={"decider": "embedded"}))
    with pytest.raises(StoreUnavailableError):
        review(deciding, job["job_id"], tenant="default", reject="ask which day", dispatch=refused, next_step=refused)
    ended = client.get(f"/v1/jobs/{job['job_id']}").json()
    assert ended["status"] == "failed" and ended["error"]["type"] == "enqueue_failed", ended  # not left queued

    job = _in_review(client)
    with pytest.raises(StoreUnavailableError):
        review(runtime, job["job_id"], tenant="default", dispatch=refused, next_step=None,
               calls=[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}])
    ended = client.get(f"/v1/jobs/{job['job_id']}").json()
    assert ended["status"] == "failed" and ended["error"]["type"] == "enqueue_failed", ended  # not left running


def _sent_together(api: str, requests: list[tuple[str, bytes]]) -> list[int]:
    """POST each ``(path, JSON body)`` on its own connection, the bytes written back to back (both requests are in
    flight before either is answered); the status codes, in order."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(api)
    sockets = [socket.create_connection((where.hostname, where.port), timeout=30) for _ in requests]
    wire = [(f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body for path, body in requests]
    for sock, data in zip(sockets, wire):
        sock.sendall(data)
    codes = []
    for sock in sockets:
        with sock:
            codes.append(int(sock.makefile("rb").readline().split()[1]))
    return codes


def _calls_settled(client: httpx.Client, job_id: str, timeout_s: float = 30.0) -> dict:
    """The job once none of its calls is ``running`` (or as it is after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if all(c["status"] != "running" for c in job["calls"]) or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def test_a_review_and_a_cancel_sent_at_once_are_ordered_and_leave_nothing_pending(api: str) -> None:
    """20 pairs, both requests in flight together (review first in half of them). Each is one compare-and-set of the
    job, so the outcome is one of two orders and the record says which: the cancel first (the review is 409 and no
    call was ever written), or the review first and the cancel after it (both 2xx: the cancel stops the run the
    review started, its calls not started end ``call_cancelled``). Before (issue 32): 1 of 20 pairs ended
    ``cancelled`` with the reviewer's call left ``pending``; and a job in review could not be cancelled at all."""
    with httpx.Client(base_url=api, timeout=30) as client:
        jobs = [_in_review(client) for _ in range(20)]
        for n, job in enumerate(jobs):
            path = f"/v1/jobs/{job['job_id']}"
            pair = [(f"{path}/review", json.dumps({"calls": [
                        {"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]}).encode()),
                    (f"{path}/cancel", b"{}")]
            kinds = ["review", "cancel"] if n % 2 == 0 else ["cancel", "review"]
            codes = dict(zip(kinds, _sent_together(api, pair if n % 2 == 0 else pair[::-1])))
            final = wait_terminal(client, job["job_id"])
            assert "pending" not in [c["status"] for c in final["calls"]], (n, codes, final)
            # a call the review started before the cancel landed is stopped by the pipeline's cancellation watch,
            # which can come after the job reads cancelled
            final = _calls_settled(client, job["job_id"])
            statuses = [c["status"] for c in final["calls"]]
            assert "pending" not in statuses and "running" not in statuses, (n, codes, final)
            reviewed = [s["review"] for s in final["steps"] if s.get("review")]
            if codes["review"] == 409:  # the cancel came first: nothing of the review was written
                assert codes["cancel"] == 200 and final["status"] == "cancelled" and statuses == [] and not reviewed
            else:  # the review came first; a cancel after it either stopped its run or found it already ended
                assert codes["review"] == 200 and reviewed, (n, codes, final)
                if codes["cancel"] == 200:
                    assert final["status"] == "cancelled", final
                    assert all(c["status"] == "succeeded" or c["error"]["type"] == "call_cancelled"
                               for c in final["calls"]), final
                else:
                    assert codes["cancel"] == 409 and final["status"] == "succeeded", (n, codes, final)


def test_a_cancel_after_a_review_ends_the_calls_that_had_not_started(client: httpx.Client, runtime) -> None:
    """A cancel that lands after a review (the reviewer's calls written, not started): they end call_cancelled and
    never run, so a cancelled job holds no pending call — whichever of the two writes comes last settles them."""
    from executor.runs.review import review
    from executor.runs.submit import cancel

    job = _in_review(client)
    queued: list = []
    reviewed = review(runtime, job["job_id"], tenant="default", dispatch=lambda j, c: queued.append(c), next_step=None,
                      calls=[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}])
    assert reviewed.status == "running" and [c.status for c in reviewed.calls] == ["pending"] and queued
    ended, cancelled = cancel(runtime, job["job_id"], "changed my mind")  # before any worker took the call
    assert cancelled and ended.status == "cancelled"
    (call,) = client.get(f"/v1/jobs/{job['job_id']}").json()["calls"]
    assert call["status"] == "failed" and call["error"]["type"] == "call_cancelled", call
