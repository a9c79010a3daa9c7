package wireguard

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestKeyIsMadeOnceAndKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wireguard", "private.key")
	k1, created, err := LoadOrCreateKey(path)
	if err != nil || !created {
		t.Fatalf("first start: created=%v err=%v", created, err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700 | os.ModeDir} {
		if st, err := os.Stat(p); err != nil || st.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, st.Mode(), err, want)
		}
	}
	k2, created, err := LoadOrCreateKey(path)
	if err != nil || created || k2 != k1 {
		t.Fatalf("restart: created=%v same=%v err=%v; want the same key kept", created, k2 == k1, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("key directory holds %d files, want only the key", len(entries))
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	k3, created, err := LoadOrCreateKey(path)
	if err != nil || !created || k3 == k1 {
		t.Fatalf("after deleting the file: created=%v new=%v err=%v; want a new key", created, k3 != k1, err)
	}
}

func TestMalformedKeyFileIsAClearErrorAndKept(t *testing.T) {
	cases := map[string]string{
		"empty":                        "",
		"not base64":                   "this is not a key\n",
		"too short":                    "AAAA\n",
		"public key of another format": strings.Repeat("ab", 32) + "\n",
	}
	for name, text := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "private.key")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := LoadOrCreateKey(path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "delete it") {
				t.Fatalf("error %v: want one naming the file and what to do", err)
			}
			if text != "" && strings.Contains(err.Error(), strings.TrimSpace(text)) {
				t.Errorf("error quotes the file's content: %v", err)
			}
			if got, _ := os.ReadFile(path); string(got) != text {
				t.Errorf("malformed file was replaced")
			}
		})
	}
}

func TestKeyFileAsWgGenkeyWritesIt(t *testing.T) {
	k, _ := wgtypes.GeneratePrivateKey()
	path := filepath.Join(t.TempDir(), "private.key")
	if err := os.WriteFile(path, []byte("  "+k.String()+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, created, err := LoadOrCreateKey(path)
	if err != nil || created || got != k {
		t.Fatalf("got created=%v equal=%v err=%v", created, got == k, err)
	}
}

func TestPublishPatchNamesOnlyTheAnnotation(t *testing.T) {
	_, k := key(5)
	patch := PublishPatch(map[string]string{"other": "x"}, k)
	var got map[string]any
	if err := json.Unmarshal(patch, &got); err != nil {
		t.Fatal(err)
	}
	want := `{"metadata":{"annotations":{"netplane.io/wireguard-public-key":"` + k.String() + `"}}}`
	if string(patch) != want {
		t.Errorf("patch %s, want %s", patch, want)
	}
	if p := PublishPatch(map[string]string{Annotation: k.String()}, k); p != nil {
		t.Errorf("patch %s for an annotation already current, want none", p)
	}
}
