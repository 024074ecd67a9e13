package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestNoAcknowledgedRecordIsLostAfterAWriteOfUnknownOutcome: guarantee "a nil commit
// means the part is in the authority's manifest", and with it every acknowledged
// record readable.
//
// Interleaving (one authority outage, three calls):
//
//  1. a write of the owner that is not a seal's commit (W1: the renewal tick, or the
//     uploader recording a copy) lands on the authority at seq n+1; its reply and
//     its read back are lost: manifest.ErrUnknownOutcome. No part is in doubt, so
//     the next seal does not renew first.
//  2. the next seal's Commit(P2) (W2) is built on the owner's view, seq n; it is
//     published as seq n+1 and fails without landing (a plain error); its read back
//     finds seq n+1 with our epoch and owner, and a comparison of
//     sequences took W1 for W2 (the bytes tell them apart).
//  3. the seal truncates the WAL through P2. P2 is in no manifest; its records
//     were acknowledged and are now in neither the manifest nor the WAL. The read
//     fails, and a reopen of the Dir refuses the shard (sealed watermark below the
//     WAL's floor).
func TestNoAcknowledgedRecordIsLostAfterAWriteOfUnknownOutcome(t *testing.T) {
	w1 := []fault.Rule{
		{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Ambiguous: true, Err: errors.New("W1: reply lost")},
		{Ops: []substrate.Op{substrate.OpGet}, Key: "manifest$", Nth: 1, Err: errors.New("W1: read back lost")},
		{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 2, Err: errors.New("W2: 503, not applied")},
	}
	for _, via := range []string{"renewal tick", "uploader record"} {
		t.Run(via, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			authDrv := mem.New()
			authFD := fault.Wrap(authDrv, 1)
			auth := substratetest.NewBucket(t, "a", authFD)
			opts := Options{Dir: dir, Bucket: auth, Seal: quietSealOptions(),
				// No renewal tick of its own during the test: the test makes it.
				Lease: LeaseOptions{Duration: 2 * time.Hour}, RenewEvery: time.Hour}
			if via == "uploader record" {
				opts.Bucket = nil
				opts.Replicas = []replica.Spec{
					{Name: "a", Domain: "d1", Bucket: auth},
					{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", nil)}}
				opts.Authority = "a"
				opts.Upload = replica.Options{Attempts: 1, BackoffMin: time.Millisecond}
			}
			e := open(t, opts)
			sh := openShard(t, e, "s")
			want := appendBatches(t, sh, 2)
			if via == "uploader record" {
				// The seal's commit is CAS 1 (clean); the uploader's record of the copy
				// on b is W1.
				authFD.SetRules(shift(w1)...)
				if _, err := sh.Seal(ctx, 1<<30); err != nil {
					t.Fatal(err)
				}
				fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				e.FlushAndWaitUploads(fctx) // the record's error is the job's; ignore it
				cancel()
			} else {
				if _, err := sh.Seal(ctx, 1<<30); err != nil {
					t.Fatal(err)
				}
				authFD.SetRules(w1...)
				// What renewLeases does at its tick.
				owners, _ := e.owners()
				if err := owners["s"].Confirm(ctx); !errors.Is(err, manifest.ErrUnknownOutcome) {
					t.Fatalf("W1: %v, want ErrUnknownOutcome", err)
				}
			}
			if authFD.Injected() < 2 {
				t.Fatalf("W1 did not run as planned (%d faults fired)", authFD.Injected())
			}
			want = append(want, appendBatches(t, sh, 2)...) // acknowledged: durable
			_, serr := sh.Seal(ctx, 1<<30)
			authFD.SetRules()
			t.Logf("the seal of the second two batches: %v", serr)

			m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "a", authDrv), "s")
			if err != nil {
				t.Fatal(err)
			}
			info := sh.Info()
			t.Logf("authority: seq %d sealed %d parts %d; WAL next %d unsealed bytes %d; owner view sealed %d",
				m.Seq, m.Sealed, len(m.Parts), info.Next, info.UnsealedBytes, info.Sealed)
			var got [][]byte
			var rerr error
			for rec, err := range sh.Read(ctx, 0) {
				if err != nil {
					rerr = err
					break
				}
				got = append(got, rec.Value)
			}
			if rerr != nil || !equal(got, want) {
				t.Errorf("after the seal returned %v: read %d of %d acknowledged records, err %v", serr, len(got), len(want), rerr)
			}
			if err := e.Close(); err != nil {
				t.Logf("engine close: %v", err)
			}
			e2 := open(t, Options{Dir: dir, Replicas: opts.Replicas, Authority: opts.Authority, Bucket: opts.Bucket, Seal: quietSealOptions()})
			sh2, err := e2.OpenShard(ctx, "s")
			if err != nil {
				t.Fatalf("reopening the Dir: %v", err)
			}
			if got := readAll(t, sh2, 0); !equal(got, want) {
				t.Fatalf("after a reopen: %d of %d acknowledged records", len(got), len(want))
			}
		})
	}
}

// shift moves every Nth of rules matching CAS one later (the first CAS is the
// clean commit of the first seal).
func shift(rules []fault.Rule) []fault.Rule {
	out := make([]fault.Rule, len(rules))
	for i, r := range rules {
		if r.Ops[0] == substrate.OpCompareAndSwap {
			r.Nth++
		}
		out[i] = r
	}
	return out
}
