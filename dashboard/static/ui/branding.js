// Branding editor: colour pickers mirror the text fields (the text field is what is submitted).
// A static file, not an inline script, so the Content-Security-Policy needs no 'unsafe-inline'.
document.querySelectorAll("input[type=color][data-sync]").forEach(function (picker) {
  var text = document.getElementById(picker.dataset.sync);
  picker.addEventListener("input", function () { text.value = picker.value; text.dispatchEvent(new Event("input", {bubbles: true})); });
  text.addEventListener("input", function () { if (/^#[0-9a-fA-F]{6}$/.test(text.value)) picker.value = text.value.toLowerCase(); });
});
