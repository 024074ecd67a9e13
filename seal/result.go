package seal

// Result is what one seal did.
type Result struct {
	Records  uint64
	RawBytes uint64 // record bytes sealed
	Objects  int    // objects written
	Size     int64  // bytes of the objects
	// Cut reports that the budget left records unsealed.
	Cut bool
}

// Empty reports a seal that found nothing to seal.
func (r Result) Empty() bool { return r.Records == 0 }
