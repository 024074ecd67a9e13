// Package tests holds l0's integration, crash and fault tests across packages.
package tests
