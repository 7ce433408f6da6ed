// SPDX-License-Identifier: Apache-2.0

package yamlread

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// resolvePlain returns the tag of a plain scalar by the core schema, in
// yaml.v3's order of tries, so that a value means what it meant when
// yaml.v3 read the file.
func resolvePlain(value string) Tag {
	if value == "" {
		return TagNull
	}
	switch value {
	case "~", "null", "Null", "NULL":
		return TagNull
	case "true", "True", "TRUE", "false", "False", "FALSE":
		return TagBool
	case ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF":
		return TagFloat
	}
	switch c := value[0]; {
	case c == '.':
		if _, err := strconv.ParseFloat(value, 64); err == nil {
			return TagFloat
		}
	case c == '+' || c == '-' || c >= '0' && c <= '9':
		if isTimestamp(value) {
			return TagTimestamp
		}
		// strconv's errors allocate: try only what can be a number.
		if strings.Trim(value, "0123456789abcdefABCDEFxXoO+-_.") != "" {
			return TagStr
		}
		if isInt(strings.ReplaceAll(value, "_", "")) {
			return TagInt
		}
		if plain := strings.ReplaceAll(value, "_", ""); floatSyntax.MatchString(plain) {
			if _, err := strconv.ParseFloat(plain, 64); err == nil {
				return TagFloat
			}
		}
	}
	return TagStr
}

var floatSyntax = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// isInt: Go's integer syntax with a base prefix (0x, 0o, 0b, 0), and
// YAML's 0b and 0o with a sign, within 64 bits (signed or not).
func isInt(s string) bool {
	if _, err := strconv.ParseInt(s, 0, 64); err == nil {
		return true
	}
	if _, err := strconv.ParseUint(s, 0, 64); err == nil {
		return true
	}
	for _, p := range []struct {
		prefix string
		base   int
	}{{"0b", 2}, {"0o", 8}} {
		if digits, ok := strings.CutPrefix(s, p.prefix); ok {
			if _, err := strconv.ParseInt(digits, p.base, 64); err == nil {
				return true
			}
			if _, err := strconv.ParseUint(digits, p.base, 64); err == nil {
				return true
			}
		} else if digits, ok := strings.CutPrefix(s, "-"+p.prefix); ok {
			if _, err := strconv.ParseInt("-"+digits, p.base, 64); err == nil {
				return true
			}
		}
	}
	return false
}

var timestampLayouts = []string{
	"2006-1-2T15:4:5.999999999Z07:00",
	"2006-1-2t15:4:5.999999999Z07:00",
	"2006-1-2 15:4:5.999999999",
	"2006-1-2",
}

// isTimestamp: four digits, a dash, then one of the layouts.
func isTimestamp(s string) bool {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i != 4 || i == len(s) || s[i] != '-' {
		return false
	}
	for _, layout := range timestampLayouts {
		if _, err := time.Parse(layout, s); err == nil {
			return true
		}
	}
	return false
}

// explicitTag returns the tag named by "!!name" among those this reader
// supports, and false for any other.
func explicitTag(name string) (Tag, bool) {
	switch name {
	case "!!str":
		return TagStr, true
	case "!!int":
		return TagInt, true
	case "!!bool":
		return TagBool, true
	case "!!null":
		return TagNull, true
	case "!!float":
		return TagFloat, true
	case "!!map":
		return TagMap, true
	case "!!seq":
		return TagSeq, true
	}
	return 0, false
}
