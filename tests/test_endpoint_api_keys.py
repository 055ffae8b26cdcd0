"""API keys on the serving endpoint: without the key 401 (OpenAI's error body), with it the
completions, chat and streaming paths work through the real `openai` client; probes open by
default, keyed when configured; keys from a file and the environment, a bad file named."""
from __future__ import annotations

import httpx
import openai
import pytest

from executors.coserving.endpoint.api_keys import KEY_ENV, authorized, load_keys
from executors.coserving.endpoint.app import start_endpoint, stop_endpoint
from fake_serving import FakeServingExecutor, fake_model_dir

KEYS = ("sk-first", "sk-second")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    model = fake_model_dir(tmp_path_factory.mktemp("m") / "tiny-serving")
    open_ep = start_endpoint(FakeServingExecutor(), model, worker="keyed-0", api_keys=KEYS)
    closed_ep = start_endpoint(FakeServingExecutor(), model, worker="keyed-1", api_keys=KEYS, open_paths=())
    yield open_ep.url, closed_ep.url
    stop_endpoint("keyed-0")
    stop_endpoint("keyed-1")


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_no_key_or_a_wrong_one_is_refused_with_openais_error(keyed) -> None:
    url, _ = keyed
    r = httpx.post(url + "/v1/completions", json={"model": "tiny-serving", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "missing API key" in r.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
        _client(url, "sk-first-but-longer").completions.create(model="tiny-serving", prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        _client(url, "sk-secon").chat.completions.create(
            model="tiny-serving", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert 'status="401"' in httpx.get(url + "/metrics").text  # counted, and the probe is open


def test_each_key_works_on_completions_chat_and_streaming(keyed) -> None:
    url, _ = keyed
    for key in KEYS:
        client = _client(url, key)
        assert client.completions.create(model="tiny-serving", prompt=[5, 6], max_tokens=3).usage.completion_tokens == 3
        chat = client.chat.completions.create(model="tiny-serving", max_tokens=2,
                                              messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].finish_reason in ("length", "stop")
        chunks = list(client.completions.create(model="tiny-serving", prompt=[9], max_tokens=3, stream=True))
        assert chunks and chunks[-1].choices[0].finish_reason is not None


def test_probes_are_keyed_when_configured(keyed) -> None:
    _, url = keyed
    assert httpx.get(url + "/health").status_code == 401
    assert httpx.get(url + "/health", headers={"Authorization": "Bearer sk-second"}).status_code == 200


def test_keys_from_a_file_and_the_environment(tmp_path) -> None:
    f = tmp_path / "keys"
    f.write_text("# serving keys\nsk-a\n\n  sk-b  \n")
    assert load_keys(f, {KEY_ENV: "sk-env"}) == ("sk-a", "sk-b", "sk-env")
    assert load_keys(None, {}) == ()
    with pytest.raises(FileNotFoundError, match="no-such-file"):
        load_keys(tmp_path / "no-such-file", {})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        load_keys(tmp_path / "empty", {})
    assert authorized(None, ()) and not authorized(None, ("k",))
    assert authorized("Bearer k", ("x", "k")) and not authorized("Basic k", ("k",))
