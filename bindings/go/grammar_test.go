package llminfer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const personSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
  },
  "required": ["name", "age", "tags"],
  "additionalProperties": false
}`

// checkPerson parses text with encoding/json and checks it against
// personSchema.
func needGrammars(t *testing.T, m *Model) {
	t.Helper()
	requireAPI(t, 10300, "grammars", func() error {
		_, err := CompileRegex(m, "a", nil)
		return err
	})
}

func checkPerson(t *testing.T, text string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("%q: %v", text, err)
	}
	if _, err := dec.Token(); err == nil {
		t.Fatalf("%q: text after the JSON value", text)
	}
	name, okName := obj["name"].(string)
	age, okAge := obj["age"].(json.Number)
	tags, okTags := obj["tags"].([]any)
	if len(obj) != 3 || !okName || !okAge || !okTags {
		t.Fatalf("%q: want exactly a string name, a number age and an array tags", text)
	}
	if len([]rune(name)) > 12 {
		t.Fatalf("%q: name longer than 12", text)
	}
	if _, err := age.Int64(); err != nil || strings.ContainsAny(age.String(), ".eE") {
		t.Fatalf("%q: age is no integer", text)
	}
	if len(tags) > 3 {
		t.Fatalf("%q: more than 3 tags", text)
	}
	for _, tag := range tags {
		if tag != "a" && tag != "b" {
			t.Fatalf("%q: tag %v", text, tag)
		}
	}
}

func TestJSONSchemaOutputFollowsSchema(t *testing.T) {
	m := testModel(t)
	needGrammars(t, m)
	s := testSession(t, m)
	prompt := tokenize(t, m, "A person as JSON:\n")
	for _, ws := range []GrammarWhitespace{WhitespaceCompact, WhitespaceFlexible} {
		g, err := CompileJSONSchema(m, personSchema, &GrammarOptions{Whitespace: ws})
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range []struct {
			seed uint64
			temp float32
		}{{0, 0}, {1, 1}, {2, 1}} {
			sampling := DefaultSampling()
			sampling.Temperature, sampling.Seed, sampling.Grammar = run.temp, run.seed, g
			gen, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 160, Sampling: &sampling})
			if err != nil {
				t.Fatal(err)
			}
			if gen.Finish != FinishStop && gen.Finish != FinishEOS {
				t.Fatalf("finished with %v: %q", gen.Finish, gen.Text)
			}
			checkPerson(t, gen.Text)
		}
		if g.InUse() != 0 {
			t.Fatalf("finished generations still hold the grammar (%d)", g.InUse())
		}
		g.Close()
	}

	// A request and a stream hold their grammar until they finish, also
	// across its Close.
	g, err := CompileJSONSchema(m, personSchema, nil)
	if err != nil {
		t.Fatal(err)
	}
	sampling := DefaultSampling()
	sampling.Temperature, sampling.Seed, sampling.Grammar = 1, 7, g
	opts := &RequestOptions{MaxNewTokens: 160, Sampling: &sampling}
	stream, err := s.Stream(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Submit(prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if g.InUse() != 2 {
		t.Fatalf("a request and a stream hold the grammar %d times", g.InUse())
	}
	g.Close()
	if g.ptr == nil {
		t.Fatal("Close freed a grammar in use")
	}
	if _, err := s.Submit(prompt, opts); !errors.Is(err, ErrClosed) {
		t.Fatalf("a request with a closed grammar: %v", err)
	}
	_, text := collectStream(t, stream)
	checkPerson(t, text)
	var sb strings.Builder
	for done := false; !done; {
		events, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			if ev.Request == id {
				sb.WriteString(ev.Text)
				done = done || ev.Finish != FinishNone
			}
		}
	}
	checkPerson(t, sb.String())
	if g.ptr != nil || g.InUse() != 0 {
		t.Fatalf("the closed grammar was not freed after its last request (%d uses)", g.InUse())
	}
}

func TestRegexAndEBNFConstrainOutput(t *testing.T) {
	m := testModel(t)
	needGrammars(t, m)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Is Paris in France?")
	regex, err := CompileRegex(m, "(yes|no)!", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer regex.Close()
	ebnf, err := CompileEBNF(m, `answer ::= "Answer: " [0-9] [0-9]?`, &GrammarOptions{Root: "answer"})
	if err != nil {
		t.Fatal(err)
	}
	defer ebnf.Close()
	for seed := uint64(0); seed < 3; seed++ {
		run := func(g *Grammar) string {
			sampling := DefaultSampling()
			sampling.Temperature, sampling.Seed, sampling.Grammar = 1, seed, g
			gen, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 16, Sampling: &sampling})
			if err != nil {
				t.Fatal(err)
			}
			return gen.Text
		}
		if text := run(regex); text != "yes!" && text != "no!" {
			t.Fatalf("regex output %q", text)
		}
		text := run(ebnf)
		digits := strings.TrimPrefix(text, "Answer: ")
		if digits == text || len(digits) < 1 || len(digits) > 2 || strings.Trim(digits, "0123456789") != "" {
			t.Fatalf("EBNF output %q", text)
		}
	}

	// A sampler holds its grammar until it is closed.
	sampling := DefaultSampling()
	sampling.Grammar = regex
	sp, err := NewSampler(m, &sampling, 0)
	if err != nil {
		t.Fatal(err)
	}
	if regex.InUse() != 1 {
		t.Fatalf("a sampler holds the grammar %d times", regex.InUse())
	}
	sp.Close()
	if regex.InUse() != 0 {
		t.Fatalf("a closed sampler still holds the grammar")
	}
}

func TestGrammarErrors(t *testing.T) {
	m := testModel(t)
	needGrammars(t, m)
	var e *Error
	_, err := CompileJSONSchema(m, `{"properties": {"x": {"type": "number", "minimum": 1}}}`, nil)
	if !errors.As(err, &e) || e.Status != ErrUnsupported || !strings.Contains(e.Message, "/properties/x/minimum") {
		t.Fatalf("unsupported keyword: %v", err)
	}
	if _, err := CompileJSONSchema(m, `{not json`, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("malformed JSON: %v", err)
	}
	_, err = CompileEBNF(m, "root ::= [", nil)
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "1:10") {
		t.Fatalf("bad EBNF: %v", err)
	}
	g, err := CompileRegex(m, "a+", nil)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	sampling := DefaultSampling()
	sampling.Grammar = g
	s := testSession(t, m)
	if _, err := s.Generate(context.Background(), tokenize(t, m, "x"), &GenerateOptions{Sampling: &sampling}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate with a closed grammar: %v", err)
	}
	if _, err := NewSampler(m, &sampling, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSampler with a closed grammar: %v", err)
	}
}
