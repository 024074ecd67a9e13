// Package mem is an in-memory substrate driver, for tests and for measuring the layers
// above the object store. Nothing survives the process.
package mem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/l0store/l0/substrate"
)

var _ substrate.Driver = (*Driver)(nil)

// Driver keeps objects in a map. Versions are generations from one counter, so a
// version is never reused, not even after a delete.
type Driver struct {
	mu struct {
		sync.Mutex
		objects    map[string]object
		generation uint64
	}
}

type object struct {
	data     []byte
	version  substrate.Version
	modified time.Time
}

// New returns an empty in-memory driver.
func New() *Driver {
	d := &Driver{}
	d.mu.objects = make(map[string]object)
	return d
}

// Put implements substrate.Driver.
func (d *Driver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return substrate.Attrs{}, fmt.Errorf("read body: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, exists := d.mu.objects[key]
	switch {
	case cond.IfAbsent && exists:
		return substrate.Attrs{}, substrate.ErrPreconditionFailed
	case cond.IfMatch != "" && (!exists || cur.version != cond.IfMatch):
		return substrate.Attrs{}, substrate.ErrPreconditionFailed
	}
	d.mu.generation++
	o := object{data: data, version: substrate.Version(strconv.FormatUint(d.mu.generation, 10)), modified: time.Now()}
	d.mu.objects[key] = o
	return o.attrs(key), nil
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	o, ok := d.mu.objects[key]
	d.mu.Unlock()
	if !ok {
		return nil, substrate.ErrNotFound
	}
	size := int64(len(o.data))
	if off >= size && !(off == 0 && length < 0) {
		return nil, fmt.Errorf("offset %d of %d bytes: %w", off, size, substrate.ErrInvalidRange)
	}
	end := size
	if length >= 0 && length < size-off { // not off+length, which can overflow
		end = off + length
	}
	// Stored slices are never modified, so the reader needs no copy.
	return &reader{Reader: bytes.NewReader(o.data[off:end]), attrs: o.attrs(key)}, nil
}

// Attributes implements substrate.Driver.
func (d *Driver) Attributes(ctx context.Context, key string) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.mu.objects[key]
	if !ok {
		return substrate.Attrs{}, substrate.ErrNotFound
	}
	return o.attrs(key), nil
}

// List implements substrate.Driver.
func (d *Driver) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	d.mu.Lock()
	var entries []substrate.ListEntry
	for k, o := range d.mu.objects {
		if strings.HasPrefix(k, prefix) && k > startAfter {
			entries = append(entries, substrate.ListEntry{Key: k, Size: int64(len(o.data))})
		}
	}
	d.mu.Unlock()
	slices.SortFunc(entries, func(a, b substrate.ListEntry) int { return strings.Compare(a.Key, b.Key) })
	if len(entries) > limit {
		return entries[:limit], true, nil
	}
	return entries, false, nil
}

// Delete implements substrate.Driver.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.mu.objects, key)
	return nil
}

// Close implements substrate.Driver.
func (d *Driver) Close() error { return nil }

func (o object) attrs(key string) substrate.Attrs {
	return substrate.Attrs{Key: key, Size: int64(len(o.data)), Version: o.version, Modified: o.modified}
}

type reader struct {
	*bytes.Reader
	attrs substrate.Attrs
}

func (r *reader) Close() error           { return nil }
func (r *reader) Attrs() substrate.Attrs { return r.attrs }
