package policycell

import (
	"bytes"
	"testing"

	"go.yaml.in/yaml/v3"
)

func countTree(n *yaml.Node) int {
	c := 1
	for _, k := range n.Content {
		c += countTree(k)
	}
	return c
}

func TestScratchLib(t *testing.T) {
	for _, s := range []string{"[a:1]", "{a:1}", "[a: 1]", "{\"a\":1}", "[\"a\":1, \"b\":2]", "a:\n", "- \n- \n", "? a\n? b\n", "{a, b}", "a\n...\nb\n", "...\n...\n", "---\n---\n", "", "[a:b]", "[? a]", "- - - a\n", "a: !!str\n", "[a, b, ]", "{a: 1, }", "a: b\nc: d\n", "[-1]", "[a :1]"} {
		dec := yaml.NewDecoder(bytes.NewReader([]byte(s)))
		total := 0
		var err error
		for {
			var n yaml.Node
			if err = dec.Decode(&n); err != nil {
				break
			}
			total += countTree(&n)
		}
		t.Logf("%-22q nodes=%d err=%v", s, total, err)
	}
}
