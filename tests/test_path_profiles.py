"""Seed 001's hot and cold path profiles without an engine: what each sets (policies,
vLLM's batch bound) and what a user's own settings keep; the limiter's queue bound and
its 503; and `tailguard nginx`'s config (golden file, refusals in one line)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from observe import registry as R
from observe.record import RequestRecord
from serving.admission import Admission
from serving.config import ServerConfig
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter, LimiterFull
from slo.policy.decisions import Decisions
from slo.tenants import OUTCOME_SHED, outcome
from tailguard.cli import main

DEPLOY = Path(__file__).parent.parent / "docs" / "deploy"
NGINX_ARGS = ["--hot", "127.0.0.1:8001", "--cold", "127.0.0.1:8002",
              "--listen", "127.0.0.1:8080"]


@pytest.fixture
def model(tmp_path) -> str:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return str(tmp_path / "model")


@pytest.mark.parametrize("profile,limits,wait,queue,args", [
    (None, (8, 16, 64), 120.0, 0, []),
    ("hot", (4, 4, 4), 0.5, 0, ["--max-num-seqs", "4"]),
    ("cold", (8, 16, 16), 120.0, 64, ["--max-num-seqs", "16"]),
])
def test_each_profile_sets_its_batch_and_wait_bounds(model, tmp_path, profile, limits, wait,
                                                     queue, args):
    config = ServerConfig(model, db=str(tmp_path / "t.duckdb"), path_profile=profile)
    p = config.policies
    assert (p.batch_floor, p.batch_initial, p.batch_cap) == limits
    assert (p.queue_wait_s, p.max_queue, config.vllm_args) == (wait, queue, args)


def test_a_policies_file_and_an_explicit_engine_flag_win_over_the_profile(model, tmp_path):
    policies = tmp_path / "policies.yaml"
    policies.write_text("max_queue: 8\nbatch_cap: 20\n")
    config = ServerConfig(model, db=str(tmp_path / "t.duckdb"), path_profile="cold",
                          policy_file=str(policies), vllm_args=["--max-num-seqs=32"])
    p = config.policies
    assert (p.max_queue, p.batch_cap, p.batch_initial) == (8, 20, 16)
    assert config.vllm_args == ["--max-num-seqs=32"]


def test_the_profile_comes_from_the_environment_when_not_given(model, tmp_path, monkeypatch):
    monkeypatch.setenv("TAILGUARD_PATH_PROFILE", "hot")
    assert ServerConfig(model, db=str(tmp_path / "t.duckdb")).policies.queue_wait_s == 0.5
    monkeypatch.setenv("TAILGUARD_PATH_PROFILE", "lukewarm")
    with pytest.raises(ValueError, match="path_profile must be one of hot, cold"):
        ServerConfig(model, db=str(tmp_path / "t.duckdb"))


def test_a_full_queue_refuses_at_once_and_a_free_one_waits():
    async def scenario():
        limiter = Limiter(1, max_queue=2)
        await limiter.acquire(R.PRIORITY_REALTIME)  # the slot
        waiters = [asyncio.create_task(limiter.acquire(R.PRIORITY_BATCH)) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(LimiterFull, match="2 requests wait for the engine already"):
            await limiter.acquire(R.PRIORITY_BATCH)
        await asyncio.wait_for(limiter.acquire("vip"), 1)  # VIPs never queue
        limiter.release()  # the VIP's
        limiter.release()  # the first slot: the first waiter enters
        await asyncio.sleep(0.01)
        third = asyncio.create_task(limiter.acquire(R.PRIORITY_BATCH))  # room again
        await asyncio.sleep(0.01)
        state = (limiter.waiting, limiter.in_flight)
        for task in (*waiters, third):
            task.cancel()
        await asyncio.gather(*waiters, third, return_exceptions=True)
        return state
    assert asyncio.run(scenario()) == (2, 1)


def test_a_request_refused_for_a_full_queue_is_a_503_the_tenants_count_as_shed():
    async def scenario():
        service = PredictionService(None, None, retrain_interval_s=0)
        adm = Admission(LoadTracker(EngineSecond()), service, Limiter(1, max_queue=1),
                        FaultInjector(), lambda tokens: 10.0)
        adm.publish(Decisions(1))
        await adm.limiter.acquire(R.PRIORITY_REALTIME)
        waiter = asyncio.create_task(adm.limiter.acquire(R.PRIORITY_REALTIME))
        await asyncio.sleep(0.01)
        rec = RequestRecord("r", 0.0, "text_completion")
        refusal = await adm.admit(rec, {"prompt_token_ids": [1] * 10}, 10, 4)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        return rec, refusal, adm.load.pending[0]
    rec, refusal, pending = asyncio.run(scenario())
    assert (refusal.reason, refusal.status, refusal.retry_after_s) == ("queue_full", 503, 5)
    assert rec.policy_actions == ["reject:queue_full"] and pending == 0
    rec.fail(503, "queue_full", refusal.message, R.STATUS_REJECTED)
    assert outcome(rec) == OUTCOME_SHED


@pytest.mark.parametrize("target_s,actions", [
    (10.0, []),  # the wait bound (0.2 s) comes before the deadline: refused, not demoted
    (0.1, ["demote:deadline"]),  # the deadline first: demoted, then the rest of the bound
])
def test_the_wait_bound_holds_for_the_whole_wait_demoted_or_not(target_s, actions):
    async def scenario():
        service = PredictionService(None, None, retrain_interval_s=0)
        adm = Admission(LoadTracker(EngineSecond()), service, Limiter(1, max_wait_s=0.2),
                        FaultInjector(), lambda tokens: target_s)
        adm.publish(Decisions(1, deadline_margin=1.0))
        for _ in range(1000):  # slots came free fast lately: the deadline check admits
            await adm.limiter.acquire(R.PRIORITY_REALTIME)
            adm.limiter.release()
        await adm.limiter.acquire(R.PRIORITY_REALTIME)  # the one slot, never freed now
        rec = RequestRecord("r", time.monotonic(), "text_completion")
        began = time.monotonic()
        refusal = await adm.admit(rec, {"prompt_token_ids": [1] * 10}, 10, 4)
        return refusal, rec.policy_actions, time.monotonic() - began
    refusal, got, waited = asyncio.run(scenario())
    assert (refusal.reason, refusal.status) == ("admission_timeout", 503)
    assert got == actions and 0.2 <= waited < 0.35


def test_the_nginx_config_is_the_committed_example():
    result = CliRunner().invoke(main, ["nginx", "--keys", "docs/deploy/keys.example.yaml",
                                       *NGINX_ARGS])
    assert result.exit_code == 0, result.output
    assert result.output == (DEPLOY / "nginx.example.conf").read_text()


def test_the_written_config_is_private(tmp_path):
    out = tmp_path / "tailguard.conf"
    result = CliRunner().invoke(main, ["nginx", "--keys", str(DEPLOY / "keys.example.yaml"),
                                       *NGINX_ARGS, "--out", str(out)])
    assert result.exit_code == 0 and out.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("keys,args,message", [
    ("keys:\n  - {name: a, key_sha256: '" + "0" * 64 + "'}\n", [],
     "key 'a' is kept as key_sha256"),
    ("keys:\n  - {name: a, key: 'sk a\"'}\n", [], "characters nginx would need escaped"),
    ("keys:\n  - {name: a}\n", [], "needs exactly one of 'key' or 'key_sha256'"),
    ("keys:\n  - {name: a, key: sk-a}\n", ["--hot", "localhost"], "is not HOST:PORT"),
    ("keys:\n  - {name: a, key: sk-a}\n", ["--listen", "80; evil"], "is not PORT or HOST:PORT"),
])
def test_a_config_nginx_could_not_route_exits_2_with_one_line(tmp_path, keys, args, message):
    (tmp_path / "keys.yaml").write_text(keys)
    result = CliRunner().invoke(
        main, ["nginx", "--keys", str(tmp_path / "keys.yaml"), *NGINX_ARGS, *args])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "sk-a" not in result.stderr
