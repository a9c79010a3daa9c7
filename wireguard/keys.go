package wireguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// ParseKey reads a key as `wg genkey` writes it: 32 bytes in standard
// base64, surrounding white space ignored. The error says what is wrong
// without repeating the text, which may be a private key.
func ParseKey(text []byte) (wgtypes.Key, error) {
	s := string(bytes.TrimSpace(text))
	if s == "" {
		return wgtypes.Key{}, errors.New("empty: want 44 characters of base64 as `wg genkey` writes")
	}
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("not a WireGuard key (%d characters): want 32 bytes in base64 as `wg genkey` writes", len(s))
	}
	return k, nil
}

// LoadOrCreateKey returns the private key in path, making one first when
// the file does not exist: the directory with mode 0700, the file with
// 0600, written atomically so that a crash leaves either no key or a whole
// one. A file that exists but holds no valid key is an error, not
// replaced: the key may be the one the peers know.
func LoadOrCreateKey(path string) (key wgtypes.Key, created bool, err error) {
	text, err := os.ReadFile(path)
	if err == nil {
		k, err := ParseKey(text)
		if err != nil {
			return wgtypes.Key{}, false, fmt.Errorf("WireGuard private key file %s: %w; delete it to make a new key", path, err)
		}
		return k, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return wgtypes.Key{}, false, fmt.Errorf("read WireGuard private key: %w", err)
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, false, err
	}
	if err := writeKey(path, k); err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("write WireGuard private key: %w", err)
	}
	return k, true, nil
}

func writeKey(path string, k wgtypes.Key) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".private.key-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(k.String() + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// PublishPatch is the JSON merge patch that sets this node's public key
// annotation and nothing else, for the node's own Node (annotations are
// its current ones); nil when the annotation already holds the key. A
// merge patch names only the one key, so it leaves every other annotation,
// label and field as it is on the server, whoever wrote them.
func PublishPatch(annotations map[string]string, public wgtypes.Key) []byte {
	if annotations[Annotation] == public.String() {
		return nil
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{Annotation: public.String()}}}
	out, err := json.Marshal(patch)
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	return out
}
