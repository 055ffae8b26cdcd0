"""The three analyst queries of docs/analyst_queries.md, over the DuckDB view `turns`.

Run one with `rose query "<SQL>"` or TrajectoryStore(root).query(ANALYST_QUERIES[name]).
"""

# trajectory_reward repeats on every turn of a trajectory: take it once per trajectory.
REWARD_PER_STEP = """\
SELECT run, step,
       count(*)                    AS trajectories,
       avg(reward)                 AS mean_reward,
       min(reward)                 AS min_reward,
       max(reward)                 AS max_reward,
       avg(CAST(reward > 0 AS INT)) AS success_rate,
       avg(turns)                  AS mean_turns
FROM (SELECT run, step, trajectory,
             any_value(trajectory_reward) AS reward,
             count(*)                     AS turns
      FROM turns GROUP BY run, step, trajectory)
GROUP BY run, step
ORDER BY run, step"""

# Latency the policy adds to a turn (queue + prefill + decode); env time shown beside it.
TURN_LATENCY_BY_WORKER_KIND = """\
SELECT worker_kind,
       count(*)                                                  AS turns,
       avg(queued_s + prefill_s + decode_s)                      AS mean_latency_s,
       quantile_cont(queued_s + prefill_s + decode_s, 0.5)       AS p50_latency_s,
       quantile_cont(queued_s + prefill_s + decode_s, 0.99)      AS p99_latency_s,
       avg(queued_s)  AS mean_queued_s,
       avg(prefill_s) AS mean_prefill_s,
       avg(decode_s)  AS mean_decode_s,
       avg(env_s)     AS mean_env_s
FROM turns
GROUP BY worker_kind
ORDER BY worker_kind"""

# Share of prompt tokens served from the prefix cache, per worker: cache affinity at work.
PREFIX_CACHE_REUSE = """\
SELECT worker_kind, worker,
       count(*)               AS turns,
       sum(num_prompt_tokens) AS prompt_tokens,
       sum(num_cached_tokens) AS cached_tokens,
       sum(num_cached_tokens) / nullif(sum(num_prompt_tokens), 0) AS cache_reuse
FROM turns
GROUP BY worker_kind, worker
ORDER BY worker_kind, worker"""

ANALYST_QUERIES: dict[str, str] = {
    "reward_per_step": REWARD_PER_STEP,
    "turn_latency_by_worker_kind": TURN_LATENCY_BY_WORKER_KIND,
    "prefix_cache_reuse": PREFIX_CACHE_REUSE,
}
