"""Tests of envs/judge.py: the rule and LLM judges, the repetition penalty, the reasoning reward.

The LLM judge talks to a real HTTP server on 127.0.0.1 (an ephemeral port, one thread) whose
behaviour is picked by the first path segment of the base URL.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs.judge import (
    LLMJudge,
    ReasoningReward,
    RepetitionPenalty,
    RuleJudge,
    make_reasoning_reward,
)
from envs.relations import describe

TRUTH = describe((2, 2), [("box", (1, 1)), ("target", (3, 2))])
WRONG = "The box is below and to the right of the player. The target is above the player."

# ---------------------------------------------------------------- a real local chat server


class _ChatHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.path.strip("/").split("/")[0]
        server.requests.append((mode, self.path, dict(self.headers), body))
        if mode == "slow":
            server.release.wait(5.0)
        if mode == "error":
            self._send(500, b'{"error": "boom"}')
            return
        if mode == "badjson":
            self._send(200, b"{not json")
            return
        n_mode = sum(1 for r in server.requests if r[0] == mode)
        content = {
            "yes": "YES",
            "yesdot": " Yes.",
            "no": "NO, the box is elsewhere.",
            "garbage": "maybe?",
            "lateyes": "hmm" if n_mode < 3 else "yes",
            "slow": "YES",
        }[mode]
        reply = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        self._send(200, json.dumps(reply).encode())

    def _send(self, status: int, payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up (timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    srv.daemon_threads = True
    srv.requests, srv.release = [], threading.Event()
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def judge_for(srv, mode: str, **kwargs) -> LLMJudge:
    host, port = srv.server_address[:2]
    return LLMJudge(f"http://{host}:{port}/{mode}/v1/", "judge-model", **kwargs)


def test_llm_judge_yes_and_no(server):
    judge = judge_for(server, "yes", api_key="secret")
    assert judge.score("The box is up-left.", TRUTH) == 1.0
    assert judge_for(server, "yesdot").score("x", TRUTH) == 1.0
    no = judge_for(server, "no")
    assert no.score("The box is down.", TRUTH) == 0.0
    assert judge.failures == 0 and no.failures == 0
    mode, path, headers, body = server.requests[0]
    assert path == "/yes/v1/chat/completions"
    assert headers["Authorization"] == "Bearer secret"
    assert body["model"] == "judge-model" and body["temperature"] == 0.1
    user = body["messages"][-1]["content"]
    assert TRUTH in user and "The box is up-left." in user
    assert "Authorization" not in server.requests[1][2]


def test_llm_judge_garbage_retries_then_fails(server):
    judge = judge_for(server, "garbage", retries=2)
    assert judge.score("x", TRUTH) is None
    assert judge.failures == 1
    assert len(server.requests) == 3  # one try and two retries
    assert judge.score("x", TRUTH) is None and judge.failures == 2


def test_llm_judge_retry_can_recover(server):
    judge = judge_for(server, "lateyes", retries=2)
    assert judge.score("x", TRUTH) == 1.0
    assert judge.failures == 0 and len(server.requests) == 3


def test_llm_judge_timeout_fails_within_the_timeout(server):
    judge = judge_for(server, "slow", timeout_s=0.3, retries=2)
    start = time.perf_counter()
    assert judge.score("x", TRUTH) is None
    assert time.perf_counter() - start < 1.5  # no retry after a timeout
    assert judge.failures == 1


@pytest.mark.parametrize("mode", ["error", "badjson"])
def test_llm_judge_http_error_and_bad_json_fail(server, mode):
    judge = judge_for(server, mode)
    assert judge.score("x", TRUTH) is None
    assert judge.failures == 1 and len(server.requests) == 1


def test_llm_judge_connection_refused_fails():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens on this port now
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", "m", timeout_s=1.0)
    assert judge.score("x", TRUTH) is None and judge.failures == 1


# ---------------------------------------------------------------- repetition penalty


def test_repetition_low_score_frequent_is_penalised():
    rep = RepetitionPenalty(window=100, top_k=5)
    for i in range(20):
        assert rep(f"unique description {i}", 0.0) == 0.0
    assert rep("The box is left.", 0.2) == 0.0  # seen once: not frequent
    assert rep("the  BOX is left.", 0.2) == -0.1  # normalised: the same description
    assert rep("The box is left.", 0.69) == -0.1
    assert rep("The box is left.", 0.7) == 0.0  # high score: no penalty


def test_repetition_high_score_never_penalised():
    rep = RepetitionPenalty()
    assert all(rep("The goal is below.", 1.0) == 0.0 for _ in range(50))


def test_repetition_rare_among_frequent_is_not_penalised():
    rep = RepetitionPenalty(window=1000, top_k=5, penalty=-0.5)
    for _ in range(10):
        for k in range(6):
            rep(f"frequent {k}", 1.0)
    assert rep("rare", 0.0) == 0.0
    assert rep("rare", 0.0) == 0.0  # count 2 < the 5th largest count, 10
    assert rep("frequent 3", 0.0) == -0.5


def test_repetition_memory_is_bounded_by_window():
    rep = RepetitionPenalty(window=50)
    rep("old", 0.0)
    rep("old", 0.0)
    for i in range(10_000):
        rep(f"d{i}", 0.0)
    assert len(rep.recent) == 50 and len(rep.counts) == 50
    assert sum(rep.counts.values()) == 50
    assert rep("old", 0.0) == 0.0  # its earlier occurrences left the window


# ---------------------------------------------------------------- reasoning reward


class _FixedJudge:
    """A judge with canned scores, recording what it was asked."""

    def __init__(self, *scores):
        self.scores, self.calls = list(scores), []

    def score(self, description, true_state_text):
        self.calls.append((description, true_state_text))
        return self.scores.pop(0)


def test_reasoning_reward_rule_judge_and_weights():
    before = TRUTH
    after = describe((1, 1), [("box", (1, 1)), ("target", (3, 2))])
    rr = ReasoningReward(RuleJudge())
    reward, m = rr(observation=before, prediction=WRONG, state_before=before, state_after=after)
    assert reward == pytest.approx(0.5)
    assert m["reasoning/observation_score"] == 1.0 and m["reasoning/prediction_score"] == 0.0
    assert m["reasoning/judge_failures"] == 0.0 and m["reasoning/repetition_penalty"] == 0.0
    rr = ReasoningReward(RuleJudge(), observation_weight=0.2, prediction_weight=0.8)
    reward, _ = rr(observation=WRONG, prediction=after, state_before=before, state_after=after)
    assert reward == pytest.approx(0.8)


def test_reasoning_reward_judges_against_the_right_states():
    judge = _FixedJudge(1.0, 0.5)
    reward, _ = ReasoningReward(judge)(
        observation="obs", prediction="pred", state_before="S0", state_after="S1"
    )
    assert judge.calls == [("obs", "S0"), ("pred", "S1")]
    assert reward == pytest.approx(0.75)


def test_reasoning_reward_none_and_empty_parts():
    judge = _FixedJudge(1.0)
    reward, m = ReasoningReward(judge)(
        observation=None, prediction="pred", state_before="S0", state_after="S1"
    )
    assert reward == 0.5 and "reasoning/observation_score" not in m
    judge = _FixedJudge()
    reward, m = ReasoningReward(judge)(
        observation="  ", prediction=None, state_before="S0", state_after="S1"
    )
    assert reward == 0.0 and judge.calls == []
    assert m["reasoning/observation_score"] == 0.0 and "reasoning/prediction_score" not in m


def test_reasoning_reward_counts_failures():
    reward, m = ReasoningReward(_FixedJudge(None, 1.0))(
        observation="obs", prediction="pred", state_before="S0", state_after="S1"
    )
    assert reward == 0.5
    assert m["reasoning/judge_failures"] == 1.0 and m["reasoning/observation_score"] == 0.0
    _, m = ReasoningReward(_FixedJudge(None, None))(
        observation="obs", prediction="pred", state_before="S0", state_after="S1"
    )
    assert m["reasoning/judge_failures"] == 2.0


def test_reasoning_reward_repetition_penalty():
    rr = ReasoningReward(RuleJudge(), repetition=RepetitionPenalty(window=10, top_k=2))
    rewards = [
        rr(observation=WRONG, prediction=None, state_before=TRUTH, state_after=TRUTH)
        for _ in range(3)
    ]
    assert [r for r, _ in rewards] == pytest.approx([0.0, -0.1, -0.1])
    assert rewards[-1][1]["reasoning/repetition_penalty"] == pytest.approx(-0.1)
    reward, m = rr(observation=TRUTH, prediction=TRUTH, state_before=TRUTH, state_after=TRUTH)
    assert reward == 1.0 and m["reasoning/repetition_penalty"] == 0.0


# ---------------------------------------------------------------- config


def test_make_reasoning_reward_disabled():
    assert make_reasoning_reward(None) is None
    assert make_reasoning_reward({"enabled": False, "judge": "llm"}) is None


def test_make_reasoning_reward_rule_and_llm():
    rr = make_reasoning_reward({})
    assert isinstance(rr.judge, RuleJudge) and rr.repetition is None
    assert (rr.observation_weight, rr.prediction_weight) == (0.5, 0.5)
    rr = make_reasoning_reward(
        {"judge": "rule", "kinds": ["box"], "prediction_weight": 1, "repetition_penalty": True}
    )
    assert rr.judge.kinds == ("box",) and rr.prediction_weight == 1.0
    assert isinstance(rr.repetition, RepetitionPenalty)
    rr = make_reasoning_reward(
        {"judge": "llm", "base_url": "http://h:1/v1", "model": "m", "timeout_s": 3,
         "repetition_penalty": {"window": 10, "penalty": -0.2}}
    )  # fmt: skip
    assert isinstance(rr.judge, LLMJudge)
    assert rr.judge.url == "http://h:1/v1/chat/completions" and rr.judge.timeout_s == 3
    assert rr.repetition.window == 10 and rr.repetition.penalty == -0.2


@pytest.mark.parametrize(
    "config,match",
    [
        ({"judge": "rule", "colour": 1}, "colour"),
        ({"judge": "rule", "base_url": "http://h"}, "base_url"),
        ({"judge": "llm", "base_url": "http://h"}, "model"),
        ({"judge": "oracle"}, "oracle"),
        ({"observation_weight": -1}, "weights"),
        ({"repetition_penalty": {"size": 3}}, "size"),
    ],
)
def test_make_reasoning_reward_rejects_bad_config(config, match):
    with pytest.raises(ValueError, match=match):
        make_reasoning_reward(config)
