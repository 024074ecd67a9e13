//go:build !l0broken

// Package broken lets a test build of the engine switch off one of its guards, to
// show that the simulation catches the engine without it. Only a build with the
// l0broken tag can: in every other build Is is a constant false, and the compiler
// removes the broken paths.
package broken

// Is reports whether guard is switched off.
func Is(guard Guard) bool { return false }
