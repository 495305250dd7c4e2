package llminfer

import (
	"errors"
	"os"
	"testing"
)

// The tests that need a model read its path from LLMINFER_TEST_MODEL.
func testModel(t *testing.T) *Model {
	t.Helper()
	path := os.Getenv("LLMINFER_TEST_MODEL")
	if path == "" {
		t.Skip("LLMINFER_TEST_MODEL is not set: skipping a test that needs a model")
	}
	m, err := LoadModel(path, nil)
	if err != nil {
		t.Fatalf("LoadModel: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Small sessions keep the tests fast and light on memory on a 2-core machine.
func testSession(t *testing.T, m *Model) *Session {
	t.Helper()
	s, err := NewSession(m, &SessionOptions{Threads: 2, ContextLength: 512, KVCacheBytes: 64 << 20})
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func tokenize(t *testing.T, m *Model, text string) []Token {
	t.Helper()
	tokens, err := m.Tokenize(text, AddSpecial|ParseSpecial)
	if err != nil {
		t.Fatalf("Tokenize(%q): %v", text, err)
	}
	return tokens
}

// requireAPI skips a test of an API the loaded library predates, after
// checking that the binding refuses it with ErrUnsupported, not a crash.
func requireAPI(t *testing.T, version int, what string, try func() error) {
	t.Helper()
	if VersionNumber() >= version {
		return
	}
	if err := try(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("%s with library %s: %v, want ErrUnsupported", what, Version(), err)
	}
	t.Skipf("library %s has no %s", Version(), what)
}

func sameTokens(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
