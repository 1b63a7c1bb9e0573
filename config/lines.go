package config

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// withLine adds to a validation problem ("routes[0].lease: ...") the line
// of its field in the file doc (the document's top mapping), as the
// decoding problems carry theirs: "routes[0].lease: ... (line 9)". A field
// the file does not write (a default found wanting) is given the line of
// the nearest section that it does write, the route's for a route's field;
// a problem of no field the file writes is left as it is.
func withLine(doc *yaml.Node, problem string) string {
	path, _, ok := strings.Cut(problem, ": ")
	if !ok {
		return problem
	}
	if line := fieldLine(doc, path); line > 0 {
		return problem + " (line " + strconv.Itoa(line) + ")"
	}
	return problem
}

// fieldLine returns the line of the field at path ("routes[1].key.json",
// "store.redis.addrs[0]") under n, or of the deepest part of the path the
// file writes; 0 when it writes none of it.
func fieldLine(n *yaml.Node, path string) int {
	line := 0
	for _, seg := range strings.Split(path, ".") {
		name, idx, _ := strings.Cut(seg, "[")
		k, v := lookupField(n, name)
		if k == nil {
			return line
		}
		line, n = k.Line, v
		for idx != "" {
			var num string
			num, idx, _ = strings.Cut(idx, "]")
			idx = strings.TrimPrefix(idx, "[")
			i, err := strconv.Atoi(num)
			n = deref(n)
			if err != nil || n == nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
				return line
			}
			n = n.Content[i]
			line = n.Line
		}
	}
	return line
}

// lookupField finds the field name in mapping n, merged mappings
// ("<<: *base") included, and returns its key and value nodes.
func lookupField(n *yaml.Node, name string) (key, value *yaml.Node) {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" {
			if v = deref(v); v != nil && v.Kind == yaml.SequenceNode {
				merged = append(merged, v.Content...)
			} else {
				merged = append(merged, v)
			}
			continue
		}
		if k.Kind == yaml.ScalarNode && k.Value == name {
			return k, v
		}
	}
	for _, m := range merged {
		if k, v := lookupField(m, name); k != nil {
			return k, v
		}
	}
	return nil, nil
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}
