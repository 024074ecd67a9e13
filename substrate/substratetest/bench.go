package substratetest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/l0store/l0/substrate"
)

// BenchmarkObjectSize is the object size of the driver benchmarks: about one
// compressed block group of a part.
const BenchmarkObjectSize = 64 << 10

// RunBenchmarks measures 64 KiB puts (one writer, and eight), put-if-absent and gets
// against the drivers newDriver makes; each sub-benchmark gets a fresh driver. Figures
// are in ops/s and MB/s.
func RunBenchmarks(b *testing.B, newDriver Harness) {
	data := make([]byte, BenchmarkObjectSize)
	rand.Read(data)
	open := func(b *testing.B) *substrate.Bucket {
		bkt, err := substrate.New(newDriver(b), substrate.Options{Name: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bkt.Close() })
		return bkt
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	}

	b.Run("Put64KiB", func(b *testing.B) {
		bkt := open(b)
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			if _, err := bkt.PutBytes(b.Context(), fmt.Sprintf("bench/put-%08d", i), data); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("Put64KiB-8writers", func(b *testing.B) {
		bkt := open(b)
		b.SetBytes(int64(len(data)))
		b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := bkt.PutBytes(b.Context(), fmt.Sprintf("bench/put-%08d", n.Add(1)), data); err != nil {
					b.Error(err)
					return
				}
			}
		})
		report(b)
	})
	b.Run("PutIfAbsent64KiB", func(b *testing.B) {
		bkt := open(b)
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			if _, created, err := bkt.PutIfAbsent(b.Context(), fmt.Sprintf("bench/pia-%08d", i), bytes.NewReader(data)); err != nil || !created {
				b.Fatalf("created %v, err %v", created, err)
			}
		}
		report(b)
	})
	b.Run("Get64KiB", func(b *testing.B) {
		bkt := open(b)
		const objects = 32
		for i := range objects {
			if _, err := bkt.PutBytes(b.Context(), fmt.Sprintf("bench/get-%02d", i), data); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			got, _, err := bkt.Get(b.Context(), fmt.Sprintf("bench/get-%02d", i%objects))
			if err != nil || len(got) != len(data) {
				b.Fatalf("get: %d bytes, %v", len(got), err)
			}
		}
		report(b)
	})
}
