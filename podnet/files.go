package podnet

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// writeAtomic replaces path with data unless it already holds exactly that.
// The data goes to a temporary name with an extension runtimes ignore
// (.tmp), is synced, then renamed over path: a runtime reading the
// directory sees the old file or the new one, never a partial one. It
// reports whether it wrote.
func writeAtomic(path string, data []byte, mode os.FileMode) (bool, error) {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return false, nil
	}
	return true, replace(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func replace(path string, mode os.FileMode, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	err = write(tmp)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// installPlugin copies the plugin binary src to dst unless dst already has
// the same content. The copy is renamed into place, so a runtime executing
// the plugin at that moment runs either the old binary or the new one.
func installPlugin(src, dst string) (bool, error) {
	want, err := fileHash(src)
	if err != nil {
		return false, fmt.Errorf("plugin binary %s cannot be read (%v): set --cni-plugin-path to the netplane-cni binary", src, err)
	}
	if have, err := fileHash(dst); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	return true, replace(dst, 0o755, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

// stampOf is the size, modification time and inode of each of paths, ""
// when one cannot be read: a change of content that keeps all three is
// left to the next full sync.
func stampOf(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return ""
		}
		var ino uint64
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ino = sys.Ino
		}
		fmt.Fprintf(&b, "%d %d %d;", st.Size(), st.ModTime().UnixNano(), ino)
	}
	return b.String()
}

func fileHash(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// defaultPluginPath is netplane-cni beside the running netplane binary.
func defaultPluginPath() string {
	exe, err := os.Executable()
	if err != nil {
		return "netplane-cni"
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	return filepath.Join(filepath.Dir(exe), "netplane-cni")
}
