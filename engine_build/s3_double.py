"""A local S3 for tests and the first GPU run: moto's S3 server, answering only in one region.

A boto3 client built without a region signs for us-east-1 and talks to the global endpoint;
in a VPC whose S3 gateway prefix list covers only its own region that request never arrives.
moto itself accepts any region, so :class:`RegionCheck` sits in front of it and refuses every
request not signed for the bucket's region (``AuthorizationHeaderMalformed``, without the
``Region`` hint real S3 adds: botocore would follow the hint and hide the client's mistake). Used by
``tests/engine_build`` (publish → entrypoint round trip) and by ``scripts/gpu_check.sh``::

    python -m engine_build.s3_double --region eu-west-1 --port 5900    # needs moto[server]
"""

from __future__ import annotations

import argparse
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RegionCheck", "S3Double"]

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request")


class RegionCheck:
    """WSGI middleware: a 400 ``AuthorizationHeaderMalformed`` for requests signed for another region."""

    def __init__(self, app: Callable[..., Iterable[bytes]], region: str) -> None:
        self.app = app
        self.region = region
        self.refused: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        signed_for = match.group(1) if match else None
        if signed_for != self.region:
            self.refused.append(f"{environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')} signed for {signed_for}")
            body = (
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthorizationHeaderMalformed</Code>"
                f"<Message>The authorization header is malformed; the region '{signed_for}' is wrong; "
                f"expecting another</Message></Error>"
            ).encode()
            start_response("400 Bad Request", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


class S3Double:
    """moto's S3 behind :class:`RegionCheck`, served on ``127.0.0.1:<port>`` in a thread."""

    def __init__(self, region: str, *, port: int = 0) -> None:
        from moto.moto_server import werkzeug_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        # moto's own request handler (it keeps underscores in header names) where the installed moto has one (5.2.5
        # does), werkzeug's where it has none (5.2.1, an image's system Python): what the double sends needs neither.
        handler = getattr(werkzeug_app, "MotoRequestHandler", WSGIRequestHandler)
        dispatcher = werkzeug_app.DomainDispatcherApplication(werkzeug_app.create_backend_app)

        self.region = region
        self.check = RegionCheck(dispatcher, region)
        class QuietHandler(handler):  # type: ignore[misc,valid-type]
            def log_request(self, *args: Any) -> None:
                pass

        self._server = make_server("127.0.0.1", port, self.check, threaded=True, request_handler=QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> S3Double:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--region", required=True)
    parser.add_argument("--port", type=int, default=5900)
    args = parser.parse_args(argv)
    with S3Double(args.region, port=args.port) as double:
        print(f"s3 double for {args.region} on {double.url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
