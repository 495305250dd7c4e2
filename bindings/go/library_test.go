package llminfer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	v := VersionNumber()
	if v < MinVersionNumber {
		t.Fatalf("VersionNumber() = %d, want >= %d", v, MinVersionNumber)
	}
	want := fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	if got := Version(); got != want {
		t.Fatalf("Version() = %q, VersionNumber() says %q", got, want)
	}
	if v/10000 != HeaderVersionNumber/10000 {
		t.Fatalf("library major %d, header major %d", v/10000, HeaderVersionNumber/10000)
	}
}

func TestStructLayoutsMatchLibrary(t *testing.T) {
	if m := LayoutMismatches(); len(m) != 0 {
		t.Fatalf("layout mismatches: %+v", m)
	}
	sizes := StructSizes()
	if len(sizes) < 10 {
		t.Fatalf("only %d structs checked", len(sizes))
	}
	// Built against the very library it runs with, the sizes agree too.
	if VersionNumber() == HeaderVersionNumber {
		for name, s := range sizes {
			if s[0] != s[1] {
				t.Errorf("sizeof(%s): binding %d, library %d", name, s[0], s[1])
			}
		}
	}
}

func TestStatusNames(t *testing.T) {
	if got := ErrLimit.Name(); got != "LLM_ERR_LIMIT" {
		t.Fatalf("ErrLimit.Name() = %q", got)
	}
	if got := ErrOutOfMemory.Description(); got != "out of memory" {
		t.Fatalf("ErrOutOfMemory.Description() = %q", got)
	}
	var err error = &Error{Op: "x", Status: ErrNotFound, StatusName: ErrNotFound.Name()}
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrLimit) {
		t.Fatalf("errors.Is on status values is wrong for %v", err)
	}
}

func checkLoadError(t *testing.T, err error, want Status) {
	t.Helper()
	if err == nil {
		t.Fatalf("loading succeeded, want %s", want.Name())
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	if e.Status != want || !errors.Is(err, want) {
		t.Fatalf("status %s, want %s (%v)", e.StatusName, want.Name(), err)
	}
	if e.StatusName != want.Name() || e.Message == "" {
		t.Fatalf("want a status name and a message, got %+v", e)
	}
	if !strings.Contains(err.Error(), want.Name()) || !strings.Contains(err.Error(), e.Message) {
		t.Fatalf("Error() = %q lacks the name or the message", err.Error())
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := LoadModel(filepath.Join(t.TempDir(), "missing.gguf"), nil)
	checkLoadError(t, err, ErrIO)
}

func TestLoadGarbageFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "garbage.gguf")
	garbage := []byte(strings.Repeat("this is not a GGUF file at all. ", 64))
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadModel(path, nil)
	checkLoadError(t, err, ErrBadFormat)
}

func TestModelInfo(t *testing.T) {
	m := testModel(t)
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Architecture != "llama" || info.Vocab <= 0 || info.Layers <= 0 || !info.HasChatTemplate {
		t.Fatalf("unexpected info %+v", info)
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	m := testModel(t)
	for _, text := range []string{"", "Hello, world!", "naïve café – 日本語 🙂", strings.Repeat("long text ", 300)} {
		tokens, err := m.Tokenize(text, 0)
		if err != nil {
			t.Fatalf("Tokenize(%q): %v", text, err)
		}
		back, err := m.Detokenize(tokens, 0)
		if err != nil {
			t.Fatalf("Detokenize: %v", err)
		}
		if back != text {
			t.Fatalf("round trip of %q gave %q", text, back)
		}
	}
}

func TestTokenizeSpecialAndErrors(t *testing.T) {
	m := testModel(t)
	info, _ := m.Info()
	special, err := m.Tokenize("<|im_start|>user", ParseSpecial)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := m.Tokenize("<|im_start|>user", 0)
	if len(special) >= len(plain) {
		t.Fatalf("ParseSpecial did not make a special token: %v vs %v", special, plain)
	}
	text, err := m.Detokenize(special, RenderSpecial)
	if err != nil || text != "<|im_start|>user" {
		t.Fatalf("Detokenize(RenderSpecial) = %q, %v", text, err)
	}
	_, err = m.Tokenize("bad \xff byte", 0)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidUTF8 || e.Message == "" {
		t.Fatalf("invalid UTF-8 gave %v", err)
	}
	_, err = m.Detokenize([]Token{Token(info.Vocab + 5)}, 0)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("out-of-vocabulary token gave %v", err)
	}
}

func TestChatTemplate(t *testing.T) {
	m := testModel(t)
	text, err := m.ApplyChatTemplate([]ChatMessage{
		{Role: "system", Content: "You are brief."},
		{Role: "user", Content: "Hi " + strings.Repeat("there ", 200)},
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "<|im_start|>user\nHi there") || !strings.HasSuffix(text, "<|im_start|>assistant\n") {
		t.Fatalf("unexpected rendering %q", text)
	}
}

func TestModelCloseTwiceAndUseAfterClose(t *testing.T) {
	m := testModel(t)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Tokenize("x", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Tokenize after Close gave %v", err)
	}
	if _, err := NewSession(m, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSession after Close gave %v", err)
	}
}
