// porcupine-check judges a lockedjob lab history with porcupine, the linearizability checker
// etcd's robustness tests use, against two models written here from their definitions alone:
//
//   - fenced-store: a register that takes a write when its token is at least the largest it
//     took before, and refuses it otherwise. Each write is an operation from the client's call
//     to its return; porcupine looks for one order of all writes, within those intervals, in
//     which every answer the store gave is the model's answer.
//   - one-holder: at most one client inside the critical section. Entering and leaving are
//     operations at the instant the client recorded them; entering while another is inside,
//     in every order the timestamps allow, is not linearizable.
//
// Usage: porcupine-check [-visualize DIR] HISTORY.json
//
// It prints one line per model ("fenced-store: ok") and exits 0 when both are linearizable,
// 2 when one is not, 3 when the checker timed out, 64 on bad input.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

// Write is one attempt to write to the fenced store.
type Write struct {
	Client   int   `json:"client"`
	CallUs   int64 `json:"call_us"`
	ReturnUs int64 `json:"return_us"`
	Token    int64 `json:"token"`
	Accepted bool  `json:"accepted"`
}

// Step is one entry to or exit from the critical section.
type Step struct {
	Client int   `json:"client"`
	AtUs   int64 `json:"at_us"`
	Enter  bool  `json:"enter"`
	Token  int64 `json:"token"`
}

// History is what the lab exports.
type History struct {
	Writes   []Write `json:"writes"`
	Sections []Step  `json:"sections"`
}

var fencedStore = porcupine.Model{
	Init: func() interface{} { return int64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		largest, token, accepted := state.(int64), input.(int64), output.(bool)
		if token >= largest {
			return accepted, token
		}
		return !accepted, largest
	},
	DescribeOperation: func(input, output interface{}) string {
		return fmt.Sprintf("write(token %d) -> accepted %v", input.(int64), output.(bool))
	},
	DescribeState: func(state interface{}) string {
		return fmt.Sprintf("largest token taken: %d", state.(int64))
	},
}

// A step's input: entering (true) or leaving, with the token. The state is the token of the
// client inside, 0 when nobody is.
type sectionInput struct {
	enter bool
	token int64
}

var oneHolder = porcupine.Model{
	Init: func() interface{} { return int64(0) },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		inside, step := state.(int64), input.(sectionInput)
		if step.enter {
			return inside == 0, step.token
		}
		return inside == step.token, int64(0)
	},
	DescribeOperation: func(input, _ interface{}) string {
		step := input.(sectionInput)
		if step.enter {
			return fmt.Sprintf("enter(token %d)", step.token)
		}
		return fmt.Sprintf("exit(token %d)", step.token)
	},
	DescribeState: func(state interface{}) string {
		return fmt.Sprintf("inside: token %d", state.(int64))
	},
}

func writes(history History) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(history.Writes))
	for _, w := range history.Writes {
		ops = append(ops, porcupine.Operation{
			ClientId: w.Client, Input: w.Token, Output: w.Accepted,
			Call: w.CallUs, Return: w.ReturnUs,
		})
	}
	return ops
}

func sections(history History) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(history.Sections))
	for _, s := range history.Sections {
		ops = append(ops, porcupine.Operation{
			ClientId: s.Client, Input: sectionInput{enter: s.Enter, token: s.Token},
			Output: true, Call: s.AtUs, Return: s.AtUs,
		})
	}
	return ops
}

func main() {
	visualize := flag.String("visualize", "", "write an HTML visualization of each model that fails into this directory")
	timeout := flag.Duration("timeout", time.Minute, "give up on a model after this long (exit 3)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: porcupine-check [-visualize DIR] [-timeout 1m] HISTORY.json")
		os.Exit(64)
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "porcupine-check:", err)
		os.Exit(64)
	}
	var history History
	if err := json.Unmarshal(data, &history); err != nil {
		fmt.Fprintln(os.Stderr, "porcupine-check: not a lab history:", err)
		os.Exit(64)
	}
	code := 0
	for _, check := range []struct {
		name  string
		model porcupine.Model
		ops   []porcupine.Operation
	}{
		{"fenced-store", fencedStore, writes(history)},
		{"one-holder", oneHolder, sections(history)},
	} {
		result, info := porcupine.CheckOperationsVerbose(check.model, check.ops, *timeout)
		switch result {
		case porcupine.Ok:
			fmt.Printf("%s: ok (%d operations)\n", check.name, len(check.ops))
		case porcupine.Illegal:
			fmt.Printf("%s: not linearizable (%d operations)\n", check.name, len(check.ops))
			code = max(code, 2)
		default:
			fmt.Printf("%s: unknown (timed out after %v)\n", check.name, *timeout)
			code = max(code, 3)
		}
		if *visualize != "" && result != porcupine.Ok {
			path := filepath.Join(*visualize, check.name+".html")
			if err := porcupine.VisualizePath(check.model, info, path); err != nil {
				fmt.Fprintln(os.Stderr, "porcupine-check: visualization:", err)
			}
		}
	}
	os.Exit(code)
}
