// Command gocompat answers, with Go's own regexp package, the questions kmm's
// tests ask about Go's regexp dialect (what KMM and the API server's CEL run).
//
//	gocompat names   prints the Unicode class names regexp/syntax looks up
//	gocompat         reads JSON lines {"pattern": P, "subjects": [S...]} and
//	                 writes {"error": E|null, "matches": [bool...]} per line
//
// Standard library only, so it builds offline wherever Go is installed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"unicode"
)

type question struct {
	Pattern  string   `json:"pattern"`
	Subjects []string `json:"subjects"`
}

type answer struct {
	Error   *string `json:"error"`
	Matches []bool  `json:"matches"`
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func names() error {
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"categories": keys(unicode.Categories),
		"scripts":    keys(unicode.Scripts),
		"aliases":    unicode.CategoryAliases,
		"version":    unicode.Version,
	})
}

func answers() error {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var q question
		if err := json.Unmarshal(in.Bytes(), &q); err != nil {
			return err
		}
		a := answer{Matches: []bool{}}
		re, err := regexp.Compile(q.Pattern)
		if err != nil {
			text := err.Error()
			a.Error = &text
		} else {
			for _, s := range q.Subjects {
				a.Matches = append(a.Matches, re.MatchString(s))
			}
		}
		if err := out.Encode(a); err != nil {
			return err
		}
	}
	return in.Err()
}

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "names" {
		err = names()
	} else {
		err = answers()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
