package config

import (
	"testing"
	"time"
)

func TestTypedGetters(t *testing.T) {
	env := map[string]string{"A": " 42 ", "B": "nope", "C": "off", "D": "250", "E": "-5"}
	SetGetenv(func(k string) string { return env[k] })
	defer SetGetenv(func(string) string { return "" })
	if v, ok := Int("A", 1); v != 42 || !ok {
		t.Fatalf("Int A = %d %v", v, ok)
	}
	if v, ok := Int("B", 7); v != 7 || ok {
		t.Fatalf("Int B = %d %v", v, ok)
	}
	if v, ok := Bool("C", true); v || !ok {
		t.Fatalf("Bool C = %v %v", v, ok)
	}
	if v, ok := Duration("D", time.Second); v != 250*time.Millisecond || !ok {
		t.Fatalf("Duration D = %v %v", v, ok)
	}
	if _, ok := Duration("E", time.Second); ok {
		t.Fatal("negative duration accepted")
	}
	if String("missing", "def") != "def" {
		t.Fatal("String default")
	}
}
