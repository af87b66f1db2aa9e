"""With auth_inference every /v2/models route and the repository index need the token, and so do
/metrics and the trace settings' reading: they answered anyone, naming every model, version and
state and the loads that failed (a tester). Prometheus sends the token as a bearer token. Without
auth_inference they stay open, as before."""
from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving import ServerThread, free_port, request

TOKEN = "readings-t0ken-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
READINGS = ["/metrics", "/v2/trace/setting", "/v2/models/double/trace/setting"]
# what Prometheus 2.x sends with a scrape (its scrape config's `authorization` adds the token)
SCRAPE = {"Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
          "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.53.0", "X-Prometheus-Scrape-Timeout-Seconds": "10"}


@pytest.fixture(scope="module")
def closed(models_dir, make_config):
    with ServerThread(make_config(models_dir, api_token=TOKEN, auth_inference=True,
                                  grpc_port=free_port())) as server:
        yield server


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("path", READINGS)
def test_they_need_the_token_under_auth_inference(closed, path, method):
    status, headers, body = request(closed, method, path)
    assert status == 401 and "Bearer" in headers.get("WWW-Authenticate", ""), (status, body)
    assert b"aclserve_" not in body and b"double" not in body
    assert request(closed, method, path, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert request(closed, method, path, headers=BEARER)[0] == 200


def test_prometheus_scrapes_with_its_bearer_token(closed):
    async def scrape(headers):
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(f"http://{closed.url}/metrics", headers=headers) as answer:
                return answer.status, answer.headers.get("Content-Encoding"), await answer.read()
    status, _, _ = asyncio.run(scrape(SCRAPE))
    assert status == 401
    status, coding, body = asyncio.run(scrape(dict(SCRAPE, **BEARER)))
    assert status == 200 and coding == "gzip"
    families = {f.name: f for f in text_string_to_metric_families(gzip.decompress(body).decode())}
    assert {s.labels["model"] for s in families["aclserve_model_state"].samples} >= {"double"}


def test_grpc_trace_settings_need_the_token_under_auth_inference(closed):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(f"127.0.0.1:{closed.config.grpc_port}") as client:
        with pytest.raises(InferenceServerException, match="token") as refused:
            client.get_trace_settings()
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        settings = client.get_trace_settings(headers={"authorization": f"Bearer {TOKEN}"}, as_json=True)
        assert settings["settings"]["trace_rate"]["value"] == ["1000"]


def test_they_stay_open_without_auth_inference(models_dir, make_config):
    """A token for the repository API alone: /metrics and the trace settings answer anyone."""
    with ServerThread(make_config(models_dir, api_token=TOKEN)) as server:
        for path in READINGS:
            assert request(server, "GET", path)[0] == 200, path
        status, _, body = request(server, "GET", "/metrics")
        assert status == 200 and b'aclserve_model_state{model="double"' in body
