"""Monitoring (monitoring/README.md): a live master in HA and strict multi-tenant mode exports
every metric upstream's Grafana dashboard queries for a feature this master has, under
upstream's names; the exposition passes `promtool check metrics` but for the lint warnings of
names upstream spells without _total; our dashboard queries only metrics a live master has;
our alert rules pass `promtool check rules` and their unit tests."""
import json
import pathlib
import re
import shutil
import subprocess

import pytest

from store_helpers import Master, metadata_server, new_store

ROOT = pathlib.Path(__file__).resolve().parents[2]
MON = ROOT / "monitoring"
promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(promtool is None,
                                    reason="promtool missing (Debian package prometheus)")

# The metrics upstream's Grafana dashboard (monitoring/grafana/dashboards/mooncake.json at
# 3b5a594) queries: a fact list taken from it (histograms by their family name).
UPSTREAM_DASHBOARD_EXPORTED = [
    "file_cache_hit_bytes_total",
    "file_cache_hit_nums_",
    "file_cache_nums_",
    "master_evict_disk_replica_requests_total",
    "master_active_clients",
    "master_allocated_bytes",
    "master_attempted_evictions_mem",
    "master_attempted_evictions_total",
    "master_batch_exist_key_items_total",
    "master_batch_exist_key_requests_total",
    "master_batch_get_replica_list_items_total",
    "master_batch_get_replica_list_requests_total",
    "master_batch_put_end_items_total",
    "master_batch_put_end_requests_total",
    "master_batch_put_revoke_requests_total",
    "master_batch_put_start_items_total",
    "master_batch_put_start_requests_total",
    "master_batch_replica_clear_items_total",
    "master_batch_replica_clear_requests_total",
    "master_copy_end_failures_total",
    "master_copy_end_requests_total",
    "master_copy_revoke_requests_total",
    "master_copy_start_failures_total",
    "master_copy_start_requests_total",
    "master_create_copy_task_failures_total",
    "master_create_copy_task_requests_total",
    "master_create_move_task_failures_total",
    "master_create_move_task_requests_total",
    "master_evicted_key_count",
    "master_evicted_key_count_mem",
    "master_evicted_size_bytes",
    "master_evicted_size_bytes_mem",
    "master_exist_key_failures_total",
    "master_exist_key_requests_total",
    "master_fetch_tasks_requests_total",
    "master_get_replica_list_failures_total",
    "master_get_replica_list_requests_total",
    "master_key_count",
    "master_mount_segment_requests_total",
    "master_move_end_failures_total",
    "master_move_end_requests_total",
    "master_move_revoke_requests_total",
    "master_move_start_failures_total",
    "master_move_start_requests_total",
    "master_ping_failures_total",
    "master_ping_requests_total",
    "master_put_end_failures_total",
    "master_put_end_requests_total",
    "master_put_revoke_failures_total",
    "master_put_revoke_requests_total",
    "master_put_start_alloc_failures_total",
    "master_put_start_discard_cnt",
    "master_put_start_discarded_staging_size",
    "master_put_start_failures_total",
    "master_put_start_release_cnt",
    "master_put_start_requests_total",
    "master_query_task_requests_total",
    "master_remount_segment_requests_total",
    "master_remove_all_failures_total",
    "master_remove_all_requests_total",
    "master_remove_by_regex_failures_total",
    "master_remove_by_regex_requests_total",
    "master_remove_failures_total",
    "master_remove_requests_total",
    "master_soft_pin_key_count",
    "master_successful_evictions_mem",
    "master_successful_evictions_total",
    "master_total_capacity_bytes",
    "master_unmount_segment_requests_total",
    "master_update_task_requests_total",
    "master_value_size_bytes",
    "mem_cache_hit_bytes_total",
    "mem_cache_hit_nums_",
    "mem_cache_nums_",
    "total_get_nums_",
    "valid_get_nums_",
]
# ... and those of features this master does not have (their panels show no data).
UPSTREAM_DASHBOARD_NOT_BUILT = {
    "master_allocated_file_size_bytes": "file storage / disk tier",
    "master_attempted_evictions_nof": "NoF SSD",
    "master_batch_query_ip_items_total": "BatchQueryIp",
    "master_batch_query_ip_requests_total": "BatchQueryIp",
    "master_evicted_key_count_nof": "NoF SSD",
    "master_evicted_size_bytes_nof": "NoF SSD",
    "master_get_replica_list_by_regex_failures_total": "GetReplicaListByRegex",
    "master_get_replica_list_by_regex_requests_total": "GetReplicaListByRegex",
    "master_mount_nof_segment_requests_total": "NoF SSD",
    "master_nof_allocated_bytes": "NoF SSD",
    "master_nof_heartbeat_failure_total": "NoF SSD",
    "master_nof_heartbeat_probe_latency_ms": "NoF SSD",
    "master_nof_heartbeat_success_total": "NoF SSD",
    "master_nof_heartbeat_timeout_total": "NoF SSD",
    "master_nof_segments_unmounted_by_heartbeat_total": "NoF SSD",
    "master_promotion_admitted_total": "promotion",
    "master_promotion_cancelled_total": "promotion",
    "master_promotion_completed_bytes_total": "promotion",
    "master_promotion_completed_total": "promotion",
    "master_promotion_expired_total": "promotion",
    "master_promotion_failed_total": "promotion",
    "master_promotion_in_flight": "promotion",
    "master_promotion_rejected_cap_total": "promotion",
    "master_promotion_rejected_frequency_total": "promotion",
    "master_promotion_rejected_watermark_total": "promotion",
    "master_remount_nof_segment_requests_total": "NoF SSD",
    "master_snapshot_duration_ms": "fork snapshots",
    "master_snapshot_fail": "fork snapshots",
    "master_snapshot_success": "fork snapshots",
    "master_successful_evictions_nof": "NoF SSD",
    "master_total_file_capacity_bytes": "file storage / disk tier",
    "master_total_nof_capacity_bytes": "NoF SSD",
    "master_unmount_nof_segment_requests_total": "NoF SSD",
}

# Lint warnings promtool gives upstream's own spellings, which its dashboard queries as they
# are (counters without _total, gauges ending in _count).
UPSTREAM_SPELLINGS = {
    "master_evicted_key_count", "master_evicted_key_count_mem", "master_evicted_size_bytes",
    "master_evicted_size_bytes_mem", "master_attempted_evictions_mem",
    "master_successful_evictions_mem", "master_put_start_discard_cnt",
    "master_put_start_release_cnt", "mem_cache_hit_nums_", "total_get_nums_", "valid_get_nums_",
    "master_key_count", "master_soft_pin_key_count", "file_cache_hit_nums_",
}


def families(text):
    """{family name: type} from the # TYPE lines, and the sample names."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? \S+$", text, re.M))
    return types, samples


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One master with HA on a real etcd (it leads alone) and strict tenants, after some
    traffic: its /metrics text."""
    policy = tmp_path_factory.mktemp("mon") / "quotas.yaml"
    policy.write_text("version: 1\ntenants:\n  - name: t1\n    quota: 64MB\n")
    with metadata_server("etcd") as etcd:
        endpoints = etcd[len("etcd://"):]
        m = Master(enable_ha="true", ha_backend_connstring=endpoints, enable_oplog="true",
                   cluster_id="mon", enable_multi_tenants="true",
                   tenant_quota_connector_uri=str(policy))
        try:
            import os
            os.environ["MC_STORE_CLUSTER_ID"] = "mon"
            try:
                s = new_store(type("M", (), {"addr": etcd})(), global_segment_size=32 << 20,
                              tenant_id="t1")
            finally:
                del os.environ["MC_STORE_CLUSTER_ID"]
            try:
                for i in range(20):
                    assert s.put(f"k{i}", b"v" * (100 + i)) == 0
                assert s.put_batch([f"b{i}" for i in range(8)], [b"x" * 5000] * 8) == 0
                assert s.get("k1") == b"v" * 101
                assert s.get("missing") == b""
                assert s.is_exist("k2") == 1
                assert s.remove("k3") in (0, -706)
                text = m.metrics_text()  # before close: the client's objects go with it
            finally:
                s.close()
            yield text
        finally:
            m.stop()


def test_every_dashboard_metric_of_a_built_feature_is_exported(live):
    types, samples = families(live)
    missing = [n for n in UPSTREAM_DASHBOARD_EXPORTED if n not in types]
    assert not missing, f"upstream's dashboard queries {missing}, not exported"
    built = [n for n in UPSTREAM_DASHBOARD_NOT_BUILT if n in types]
    assert not built, f"{built} are exported: move them to UPSTREAM_DASHBOARD_EXPORTED"
    # Upstream's types (a histogram as _bucket / _sum / _count).
    assert types["master_value_size_bytes"] == "histogram"
    assert {"master_value_size_bytes_bucket", "master_value_size_bytes_sum",
            "master_value_size_bytes_count"} <= samples
    for n in ("master_key_count", "master_active_clients", "master_allocated_bytes"):
        assert types[n] == "gauge", n
    for n in ("master_put_start_requests_total", "master_evicted_key_count",
              "mem_cache_hit_nums_", "master_batch_put_start_items_total"):
        assert types[n] == "counter", n
    values = {ln.split(" ")[0]: float(ln.split(" ")[1])
              for ln in live.splitlines() if ln and not ln.startswith("#")}
    assert values["master_put_start_requests_total"] >= 20  # single puts
    assert values["master_batch_put_start_items_total"] >= 8  # the batch
    assert values["master_get_replica_list_failures_total"] >= 1  # the miss, as upstream
    assert values["valid_get_nums_"] >= 1 and values["total_get_nums_"] >= 2
    assert values["master_active_clients"] >= 1
    assert values["master_ha_role"] == 1 and values["ha_oplog_last_sequence_id"] > 0
    assert values['mooncake_tenant_quota_charged_bytes{tenant_id="t1"}'] > 0


@needs_promtool
def test_the_exposition_passes_promtool_but_for_upstreams_spellings(live):
    r = subprocess.run([promtool, "check", "metrics"], input=live, capture_output=True,
                       text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert not any("error" in ln.lower() and "lint" not in ln.lower() for ln in problems), problems
    flagged = {ln.split()[0] for ln in problems}
    assert flagged <= UPSTREAM_SPELLINGS, f"lint problems beyond upstream's names: {flagged - UPSTREAM_SPELLINGS}"


def test_our_dashboard_queries_only_metrics_a_master_has(live):
    types, samples = families(live)
    dash = json.loads((MON / "grafana/dashboards/mooncake-store.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    functions = {"sum", "rate", "increase", "histogram_quantile", "clamp_min", "by", "max", "min",
                 "le", "tenant_id", "reason", "instance"}
    for e in exprs:
        bare = re.sub(r"\[[^\]]*\]|\"[^\"]*\"|\b\d+(\.\d+)?(e-?\d+)?\b", "", e)
        for name in re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", bare):
            if name in functions:
                continue
            assert name in samples or name in types, f"{name} (in {e!r}) is not on /metrics"


@needs_promtool
def test_prometheus_config_and_alert_rules():
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        r = subprocess.run([promtool, *args], cwd=MON / "prometheus", capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
