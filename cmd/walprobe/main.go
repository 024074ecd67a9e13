package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/wal"
)

func main() {
	dur := flag.Duration("d", 5*time.Second, "")
	prof := flag.String("prof", "", "")
	seg := flag.Int64("seg", 0, "")
	flag.Parse()
	dir, _ := os.MkdirTemp("/tmp", "walprobe")
	defer os.RemoveAll(dir)
	l, err := wal.Open(dir, wal.Options{SegmentSize: *seg})
	if err != nil {
		panic(err)
	}
	recs := make([][]byte, 16)
	for i := range recs {
		recs[i] = make([]byte, 1024)
	}
	var bytes atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	if *prof != "" {
		f, _ := os.Create(*prof)
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shard := fmt.Sprintf("s%02d", w)
			var firsts []uint64
			for !stop.Load() {
				first, err := l.Append(context.Background(), shard, 0, recs)
				if err != nil {
					panic(err)
				}
				bytes.Add(16 << 10)
				firsts = append(firsts, first)
				if n := len(firsts); n >= 256 && n%64 == 0 {
					if err := l.TruncateThrough(shard, 0, firsts[n-256]); err != nil {
						panic(err)
					}
				}
			}
		}()
	}
	time.Sleep(*dur)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	live, pooled := l.Segments()
	fmt.Printf("%.0f MB/s, %d fsyncs, %.1f appends/fsync, segments live %d pooled %d\n", float64(bytes.Load())/el.Seconds()/1e6, l.Fsyncs(), float64(bytes.Load()>>14)/float64(l.Fsyncs()), live, pooled)
	l.Close()
}
