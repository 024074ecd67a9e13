package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
)

// idleLine is a result line of the idle scenario with its figures decoded.
type idleLine struct {
	resultLine
	Figures idleFigures `json:"figures"`
}

// runIdle runs the idle scenario with shards shards for idleFor on the -remote kind
// and returns its table and result line.
func runIdle(t *testing.T, kind string, shards int, idleFor time.Duration) (string, idleLine) {
	t.Helper()
	remoteKind = kind
	defer func() { remoteKind = "gcs" }()
	cfg := config{scenarios: []string{"idle"}, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "r.jsonl"), rounds: 1,
		idleShards: shards, idleFor: idleFor}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cfg.results)
	if err != nil {
		t.Fatal(err)
	}
	var l idleLine
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	return out.String(), l
}

// TestTheIdleScenarioCountsRequestsAtTheProxy: the setup's requests reach the
// server through the proxy (every shard's open and seal are conditional writes),
// the idle window's figures are there, and so are the targets, the RSS one among
// them at a few shards.
func TestTheIdleScenarioCountsRequestsAtTheProxy(t *testing.T) {
	out, l := runIdle(t, "gcs", 3, 1500*time.Millisecond)
	f := l.Figures
	if f.SetupRequests.Total == 0 || f.SetupRequests.ByKind[kindConditional] < 3 || f.SetupRequests.ByMethod["POST"] == 0 {
		t.Fatalf("setup requests: %+v", f.SetupRequests)
	}
	if f.IdleSeconds < 1.5 || f.IdleRequests.ByKind == nil || f.RSSBytes == 0 || f.GoHeapInuseBytes == 0 {
		t.Fatalf("idle figures: %+v", f)
	}
	// The window is shorter than a renewal interval, and nothing else is due.
	if f.RequestsPerMinute != 0 || f.OtherRequests != 0 {
		t.Fatalf("an idle engine made requests in its first 1.5 s: %+v", f.IdleRequests)
	}
	if len(l.Targets) != 3 || l.Ratios != nil {
		t.Fatalf("targets %+v, ratios %+v", l.Targets, l.Ratios)
	}
	for _, tg := range l.Targets {
		if !tg.Met {
			t.Errorf("target not met by 3 shards idle for 1.5 s: %+v", tg)
		}
	}
	for _, s := range []string{"requests counted at a proxy", "conditional writes per renewal interval, whole engine", "≤ 1: met",
		"process RSS at the end of the window", "Go heap in use"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}

// TestTheIdleScenarioCountsS3RequestsAtTheProxy: through the proxy versitygw accepts
// the SigV4 requests signed for the proxy's host, and If-Match / If-None-Match
// writes count as conditional.
func TestTheIdleScenarioCountsS3RequestsAtTheProxy(t *testing.T) {
	_, l := runIdle(t, "s3", 2, 500*time.Millisecond)
	if s := l.Figures.SetupRequests; s.ByKind[kindConditional] < 2 || s.ByMethod["PUT"] == 0 {
		t.Fatalf("setup requests: %+v", s)
	}
}

// TestTheProxyCountsTheRequestsAClientMakes: a bucket opened through the proxy, on
// either remote, three puts (one conditional) and two gets are those five requests,
// by method and by kind.
func TestTheProxyCountsTheRequestsAClientMakes(t *testing.T) {
	for kind, putMethod := range map[string]string{"gcs": "POST", "s3": "PUT"} {
		t.Run(kind, func(t *testing.T) {
			p, b := proxiedBucket(t, kind)
			created := p.snapshot()
			if created.Total == 0 || created.ByKind[kindOther] == 0 {
				t.Fatalf("the bucket's creation did not go through the proxy: %+v", created)
			}
			ctx := t.Context()
			for _, key := range []string{"a", "b"} {
				if _, err := b.PutBytes(ctx, key, []byte(key)); err != nil {
					t.Fatal(err)
				}
			}
			if _, created, err := b.PutIfAbsentBytes(ctx, "c", []byte("c")); err != nil || !created {
				t.Fatalf("put if absent: created %v, %v", created, err)
			}
			for _, key := range []string{"a", "c"} {
				if data, _, err := b.Get(ctx, key); err != nil || string(data) != key {
					t.Fatalf("get %s: %q, %v", key, data, err)
				}
			}
			got := p.snapshot().minus(created)
			want := requestCounts{Total: 5, ByMethod: map[string]int64{putMethod: 3, "GET": 2},
				ByKind: map[requestKind]int64{kindWrite: 2, kindConditional: 1, kindGet: 2}}
			if got.Total != want.Total || !maps.Equal(got.ByMethod, want.ByMethod) || !maps.Equal(got.ByKind, want.ByKind) {
				t.Fatalf("counted %+v, want %+v", got, want)
			}
		})
	}
}

// TestTheProxyCountsEveryChunkOfAResumableUpload: an object larger than the GCS
// driver's chunk is a resumable upload, whose chunks go to the URL the server
// answered with; they come through the proxy too.
func TestTheProxyCountsEveryChunkOfAResumableUpload(t *testing.T) {
	p, b := proxiedBucket(t, "gcs")
	created := p.snapshot()
	if _, err := b.PutBytes(t.Context(), "big", make([]byte, 17<<20)); err != nil {
		t.Fatal(err)
	}
	got := p.snapshot().minus(created)
	// The Go client sends the chunks with POST too.
	if got.Total != 3 || got.ByMethod["POST"] != 3 || got.ByKind[kindWrite] != 3 {
		t.Fatalf("counted %+v, want the POST that starts the upload and one for each of two chunks", got)
	}
}

// proxiedBucket starts a remote of kind with a counting proxy in front of it and
// creates a bucket through the proxy; all are closed at the test's end.
func proxiedBucket(t *testing.T, kind string) (*countingProxy, *substrate.Bucket) {
	t.Helper()
	remoteKind = kind
	defer func() { remoteKind = "gcs" }()
	g, err := startGCS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.stop)
	p, err := startProxy(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	b, err := newBucketThrough(t.Context(), g, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return p, b
}

// TestTheOpenScenarioReplaysEveryRecordInBothContenders: on a small shard, l0's
// replay and the baseline's each read every record appended, in every round, and
// the line carries the wait for the inherited seal and the paired ratio.
func TestTheOpenScenarioReplaysEveryRecordInBothContenders(t *testing.T) {
	cfg := config{scenarios: []string{"open"}, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "r.jsonl"), rounds: 2,
		openPartsMB: 8, openWALMB: 4}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err) // the scenario fails when the contenders' counts differ
	}
	data, err := os.ReadFile(cfg.results)
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		resultLine
		Figures struct {
			Records  int64   `json:"records"`
			ToSealed float64 `json:"openshard_to_sealed_ms"`
			Replay   spread  `json:"replay_mb_per_s"`
		} `json:"figures"`
		Baselines map[string]map[string]spread `json:"baselines"`
	}
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	// 4,096 records (4.2 MB) at a time: twice for the 8 MB of parts, once for the WAL.
	if l.Figures.Records != 3*4096 || l.Figures.ToSealed <= 0 || l.Figures.Replay.Rounds != 2 {
		t.Fatalf("figures %+v", l.Figures)
	}
	if base := l.Baselines["get_and_decode_parts"]["mb_per_s"]; base.Rounds != 2 || base.Median <= 0 {
		t.Fatalf("baselines %+v", l.Baselines)
	}
	if r := l.Ratios["replay_mb_per_s_vs_get_and_decode_parts"]; len(r.PerRound) != 2 || r.Median <= 0 {
		t.Fatalf("ratios %+v", l.Ratios)
	}
	for _, s := range []string{"OpenShard → inherited 4 MB sealed", "l0 replay of every record (12288 records", "both see it warm alike"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
}
