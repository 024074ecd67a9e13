package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// dataDevice is the statistics file of the block device the runs' data is on
// (/sys/dev/block/MAJOR:MINOR/stat), or "" where there is none to read.
var dataDevice string

// watchDisk finds the block device of dir, for diskWritten.
func watchDisk(dir string) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return
	}
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	path := fmt.Sprintf("/sys/dev/block/%d:%d/stat", major, minor)
	if _, ok := readSectorsWritten(path); ok {
		dataDevice = path
	}
}

// diskWritten returns the bytes written to the data's device so far, as the
// device counts them (journal and metadata included, data deleted before its
// writeback not), and false where it cannot be read. The device is the
// machine's: anything else writing to it counts too.
func diskWritten() (int64, bool) {
	if dataDevice == "" {
		return 0, false
	}
	sectors, ok := readSectorsWritten(dataDevice)
	return sectors * 512, ok
}

// readSectorsWritten reads the sectors written from a block device's stat file
// (its seventh field, in 512-byte units whatever the device's sector size).
func readSectorsWritten(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, false
	}
	var n int64
	if _, err := fmt.Sscan(f[6], &n); err != nil {
		return 0, false
	}
	return n, true
}

// cpuUsed returns the CPU time this process has used so far, user and system,
// every thread's: the engine's goroutines, the load generator's and the kernel's
// work done on their behalf (copies into the page cache, checksums of writes).
func cpuUsed() (time.Duration, bool) {
	user, sys, ok := cpuSplit()
	return user + sys, ok
}

// cpuSplit is the process's CPU time so far in user space and in the kernel.
func cpuSplit() (user, sys time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano()), true
}
