package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// decodeChecker walks a YAML tree alongside the configuration's types and
// reports what the decoder would refuse (unknown fields, repeated fields,
// values of the wrong type) with the field's path and line, in the form of
// the validation problems ("routes[0].ttl: invalid duration "30 s" (line
// 7)"). It removes each offending node from the tree, so that the rest of
// the file still decodes and is validated.
type decodeChecker struct {
	problems []string
	// bad are the paths whose value was removed; validation problems under
	// them would only repeat the decoding problem.
	bad []string
	// badSet holds bad, once covers is first called.
	badSet map[string]bool
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// lineRE is the "line N: " prefix of the YAML library's messages.
var lineRE = regexp.MustCompile(`^line \d+: `)

func (c *decodeChecker) add(path string, line int, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s: %s (line %d)", path, fmt.Sprintf(format, args...), line))
}

// covers reports whether a validation problem concerns a path whose
// value was removed.
// A problem reads "path: message", and a path holds no ": ": only the
// heads of the path are looked up, not every removed path (a file with
// thousands of bad values would cost their number times its problems).
func (c *decodeChecker) covers(problem string) bool {
	if len(c.bad) == 0 {
		return false
	}
	if c.badSet == nil {
		c.badSet = make(map[string]bool, len(c.bad))
		for _, b := range c.bad {
			c.badSet[b] = true
		}
	}
	path := problem
	if i := strings.Index(problem, ": "); i >= 0 {
		path = problem[:i+1]
	}
	for i := 1; i < len(path); i++ {
		if (path[i] == ':' || path[i] == '.' || path[i] == '[') && c.badSet[path[:i]] {
			return true
		}
	}
	return false
}

// walk checks n against type t at path and reports whether n may stay.
// Aliases and merge keys are left to the decoder.
func (c *decodeChecker) walk(n *yaml.Node, t reflect.Type, path string) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return true
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return c.leaf(n, t, path)
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		c.mapping(n, t, path)
		return true
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, e := range n.Content {
			if !c.walk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)) {
				// An empty value in its place keeps the indexes (and the
				// count) of the elements after it.
				n.Content[i] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: e.Line, Column: e.Column}
				if et := t.Elem(); et.Kind() == reflect.Struct {
					n.Content[i] = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: e.Line, Column: e.Column}
				}
			}
		}
		return true
	}
	return c.leaf(n, t, path)
}

// mapping checks the fields of a mapping decoded into struct type t and
// drops those that are unknown, repeated or of the wrong type.
func (c *decodeChecker) mapping(n *yaml.Node, t reflect.Type, path string) {
	fields := yamlFields(t)
	first := map[string]int{}
	kept := make([]*yaml.Node, 0, len(n.Content))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" {
			kept = append(kept, k, v)
			continue
		}
		p := k.Value
		if path != "" {
			p = path + "." + k.Value
		}
		if k.Kind != yaml.ScalarNode {
			c.add(pathOr(path), k.Line, "a field name must be a plain word")
			continue
		}
		if line, ok := first[k.Value]; ok {
			c.add(p, k.Line, "given twice (first on line %d)", line)
			continue
		}
		first[k.Value] = k.Line
		ft, ok := fields[k.Value]
		if !ok {
			if near := nearest(k.Value, fields); near != "" {
				c.add(p, k.Line, "unknown field; did you mean `%s`?", near)
			} else {
				c.add(p, k.Line, "unknown field")
			}
			continue
		}
		if c.walk(v, ft, p) {
			kept = append(kept, k, v)
		}
	}
	n.Content = kept
}

// leaf decodes n into a new value of type t and reports a failure.
func (c *decodeChecker) leaf(n *yaml.Node, t reflect.Type, path string) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	c.bad = append(c.bad, path)
	msg := err.Error()
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if te, ok := err.(*yaml.TypeError); ok && len(te.Errors) > 0 {
			msg = lineRE.ReplaceAllString(te.Errors[0], "")
		}
	} else {
		msg = wantKind(t) + ", not " + describe(n)
	}
	c.add(pathOr(path), n.Line, "%s", msg)
	return false
}

func pathOr(path string) string {
	if path == "" {
		return "the file"
	}
	return path
}

// wantKind says what a value of type t is written as.
func wantKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false expected"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number expected"
	case reflect.String:
		return "a text value expected"
	case reflect.Slice:
		return "a list expected"
	case reflect.Struct, reflect.Map:
		return "a mapping of fields expected"
	}
	return "a " + t.Kind().String() + " expected"
}

// describe names what n is, for a type problem.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "..."
	}
	return fmt.Sprintf("%q", v)
}

// yamlFields maps the YAML names of t's fields (inline structs included)
// to their types, as the YAML library names them.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			for k, v := range yamlFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

// nearest returns the field name of fields closest to an unknown name,
// for a "did you mean": the one fewest edits away (a transposition is one
// edit; case, "-" for "_" are none), or "" when none is close enough for
// the guess to help: at most one edit for names of up to four letters,
// two beyond.
func nearest(name string, fields map[string]reflect.Type) string {
	norm := strings.ReplaceAll(strings.ToLower(name), "-", "_")
	maxEdits := 1
	if len([]rune(norm)) > 4 {
		maxEdits = 2
	}
	best, bestD := "", maxEdits+1
	n := utf8.RuneCountInString(norm)
	for f := range fields {
		// The lengths bound the distance from below: a name far longer
		// (a megabyte, say) is no typo, and costs no alignment.
		if m := utf8.RuneCountInString(f); n-m > maxEdits || m-n > maxEdits {
			continue
		}
		d := editDistance(norm, f)
		if d < bestD || (d == bestD && f < best) {
			best, bestD = f, d
		}
	}
	if bestD > maxEdits {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and transpositions of adjacent
// letters that turn one into the other.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// syntaxLine finds the line of a YAML syntax error in b. The YAML
// library's messages name the line where the enclosing block or flow
// collection starts, counted from zero for a parser error (so the line
// above it), not the line at fault. The line at fault is the one after the
// longest run of whole lines that still parses: a construct left open
// (a quote, a flow mapping) parses once closed, a mistake never does.
// Each try re-parses a head of the file, so the search stops after
// syntaxSearchBytes bytes parsed in all (0: the library's line stands):
// a large file with its mistake near the top would cost time quadratic
// in its size.
func syntaxLine(b []byte) (line int, text string) {
	lines := strings.SplitAfter(string(b), "\n")
	head := len(b)
	budget := syntaxSearchBytes
	for n := len(lines) - 1; n >= 0; n-- {
		head -= len(lines[n])
		if budget -= head; budget < 0 {
			return 0, ""
		}
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(strings.Join(lines[:n], "")), &root); err == nil {
			return n + 1, strings.TrimRight(lines[n], "\r\n")
		}
	}
	return 0, ""
}

// syntaxSearchBytes bounds the bytes syntaxLine re-parses: a file of up
// to a few thousand lines is searched whole.
const syntaxSearchBytes = 16 << 20

// yamlLineRE is the "yaml: line N: " prefix of a syntax error.
var yamlLineRE = regexp.MustCompile(`^yaml: (line \d+: )?`)

// syntaxError rewords a YAML syntax error of b with the line at fault
// and its text.
func syntaxError(b []byte, err error) error {
	line, text := syntaxLine(b)
	if line == 0 {
		return fmt.Errorf("parse config: %w", err)
	}
	msg := yamlLineRE.ReplaceAllString(err.Error(), "")
	return fmt.Errorf("parse config: line %d: %s: %q", line, msg, text)
}
